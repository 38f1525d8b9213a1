"""Starts SageMaker's PyTorch serving stack (the inference toolkit over TorchServe) as the container does.

Two changes, since this endpoint is local: TorchServe binds to loopback rather than every interface, and the
toolkit writes TorchServe's configuration into the working folder rather than to /etc (which needs root).
Run as ``python -m recserve.serving.sagemaker.container`` with the container's environment variables set.
"""

from __future__ import annotations

from pathlib import Path

CONFIG_FILE = "sagemaker-ts.properties"  # the container's /etc/sagemaker-ts.properties


def main() -> None:
    from sagemaker_pytorch_serving_container import serving, torchserve

    torchserve.TS_CONFIG_FILE = str(Path.cwd() / CONFIG_FILE)
    generate = torchserve._generate_ts_config_properties
    torchserve._generate_ts_config_properties = lambda handler: generate(handler).replace("0.0.0.0", "127.0.0.1")
    serving.main()


if __name__ == "__main__":
    main()
