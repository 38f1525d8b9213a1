"""``model.tar.gz`` for SageMaker from an export folder, in the layout each container expects.

- ``pytorch`` (SageMaker's PyTorch inference containers): the export at the top level (an eager export is
  rebuilt at load, so it runs on CPU or CUDA), ``code/inference.py`` with the four handler functions,
  ``code/requirements.txt`` and a copy of recserve under ``code/``, which the container puts on the path.
- ``triton`` (SageMaker's Triton containers): a model repository with one top-level model folder, which the
  endpoint names through ``SAGEMAKER_TRITON_DEFAULT_MODEL_NAME``: ``recommender_native``, the native layout
  on the container's own PyTorch or ONNX Runtime backend, from an export with a native model (torchscript,
  or onnx with dense integer IDs). Nothing else is packaged for it: the fused layout (string IDs, eager
  exports) needs recserve's Python packages in the python backend's environment, which SageMaker's Triton
  container does not install (a requirements.txt there is read by nothing), so it would fail to load;
  ``package`` refuses it and names the pytorch runtime, which serves string IDs.

``RUNTIME_EXPORTS`` names the export each runtime takes by default (``recserve.pipeline.package_from_run``).
"""

from __future__ import annotations

import logging
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from recserve.artifacts.export_manifest import ExportManifest
from recserve.constants import NATIVE_MODEL, NATIVE_ONNX_FILE, PACKAGE_INSTANCES, REPOSITORY_FILE
from recserve.errors import ServingError
from recserve.files import replaced_on_success

if TYPE_CHECKING:
    from recserve.artifacts.served import NativeShape

log = logging.getLogger(__name__)

RUNTIMES = ("pytorch", "triton")
# (backend, precision) each runtime takes by default
RUNTIME_EXPORTS = {"pytorch": ("eager", "fp32"), "triton": ("torchscript", "fp32")}
# the backends each container can run (triton: the native layout's, on its own backends)
RUNTIME_BACKENDS = {"pytorch": ("eager",), "triton": ("torchscript", "onnx")}
NO_NATIVE_FOR_TRITON = (
    "SageMaker's Triton container serves the native layout only (integer IDs, a torchscript export): "
    "this export has no native model ({reason}), and the fused layout would need Python packages that the "
    "container does not install, so the endpoint would fail to load it; package it with --runtime pytorch"
)
ENTRY_POINT = "inference.py"
# what each container needs beside the model; the endpoint's environment variables
TRITON_MODEL_ENV = "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
# The PyTorch container's TorchServe, as measured best on 2 cores (docs/sagemaker.md, "Throughput"): batches of
# up to 16 requests gathered for at most 1 ms (the container reads SAGEMAKER_TS_*), answered by the handler's
# batch transform in one graph call; one intra-op thread a worker (more spin against TorchServe's frontend)
TS_BATCH_SIZE, TS_MAX_BATCH_DELAY_MS, TS_THREADS = 16, 1, 1
WORKER_VARIABLES = ("SAGEMAKER_TS_MIN_WORKERS", "SAGEMAKER_TS_MAX_WORKERS")


def pytorch_environment(workers: int = 1) -> dict[str, str]:
    """The PyTorch container's environment for a recserve package with ``workers`` TorchServe workers (model
    processes). With SAGEMAKER_TS_* set, the container takes the worker count from SAGEMAKER_TS_MIN_WORKERS and
    SAGEMAKER_TS_MAX_WORKERS (SAGEMAKER_MODEL_SERVER_WORKERS no longer applies)."""
    return {
        "SAGEMAKER_PROGRAM": ENTRY_POINT,
        "SAGEMAKER_TS_BATCH_SIZE": str(TS_BATCH_SIZE),
        "SAGEMAKER_TS_MAX_BATCH_DELAY": str(TS_MAX_BATCH_DELAY_MS),
        **dict.fromkeys(WORKER_VARIABLES, str(workers)),
        "OMP_NUM_THREADS": str(TS_THREADS),
    }


ENVIRONMENT = {
    "pytorch": pytorch_environment(),
    "triton": {TRITON_MODEL_ENV: NATIVE_MODEL},
}
HANDLER_SHIM = '''"""SageMaker entry point written by `recserve sagemaker package`; the handler lives in recserve."""

from recserve.serving.sagemaker.handler import (  # noqa: F401
    input_fn,
    install_transform,
    model_fn,
    output_fn,
    predict_fn,
)

install_transform()
'''
REQUIREMENTS = "numpy>=1.24,<2\n"  # torch comes with the container


def check_runtime(runtime: str, out: Path) -> None:
    if runtime not in RUNTIMES:
        raise ServingError(f"runtime {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    if not Path(out).name.endswith(".tar.gz"):
        raise ServingError(f"{out}: the package must be a .tar.gz file (SageMaker reads model.tar.gz)")


def package(export_dir: Path, runtime: str, out: Path, instances: int | None = None) -> dict:
    """Writes ``out`` (a model.tar.gz) for ``runtime`` from an export folder; returns what it holds and the
    environment to set. A triton package runs where its export was made for (KIND_GPU instances for a CUDA
    export), ``instances`` model instances (default ``constants.PACKAGE_INSTANCES``) on Triton's PyTorch or ONNX
    Runtime backend, which the SageMaker Triton container has.

    Raises:
        ServingError: an unknown runtime, an output name that is not .tar.gz, or an export whose backend the
            runtime's container cannot run (``RUNTIME_BACKENDS``).
    """
    check_runtime(runtime, out)
    if instances is not None and instances < 1:
        raise ServingError(f"instances {instances}: must be at least 1")
    export_dir, out = Path(export_dir), Path(out)
    manifest = ExportManifest.read(export_dir)
    if manifest.backend not in RUNTIME_BACKENDS[runtime]:
        raise ServingError(
            f"the {runtime} runtime serves {' or '.join(RUNTIME_BACKENDS[runtime])} exports, not "
            f"{manifest.backend}; export with --backend {RUNTIME_EXPORTS[runtime][0]}"
        )
    if runtime == "triton" and manifest.native_model is None:
        reason = "string IDs" if manifest.item_id_type == "string" else "sparse integer IDs in an onnx export"
        raise ServingError(NO_NATIVE_FOR_TRITON.format(reason=reason))
    with tempfile.TemporaryDirectory(prefix="recserve-package-") as tmp:
        root = Path(tmp) / "model"
        root.mkdir()
        if runtime == "pytorch":
            _write_pytorch(export_dir, root)
        else:
            _write_triton(export_dir, root, manifest, instances)
        with replaced_on_success(out, folder=False) as partial, tarfile.open(partial, "w:gz") as tar:
            for path in sorted(root.rglob("*")):
                if "__pycache__" not in path.parts:
                    tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
    return {
        "package": str(out),
        "runtime": runtime,
        "model": manifest.model,
        "backend": manifest.backend,
        "layout": "native" if runtime == "triton" else None,
        "environment": ENVIRONMENT[runtime],
        "bytes": out.stat().st_size,
    }


def _write_pytorch(export_dir: Path, root: Path) -> None:
    shutil.copytree(export_dir, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".*"))
    code = root / "code"
    code.mkdir()
    (code / ENTRY_POINT).write_text(HANDLER_SHIM)
    (code / "requirements.txt").write_text(REQUIREMENTS)
    copy_package(code)


def _write_triton(export_dir: Path, root: Path, manifest: ExportManifest, instances: int | None) -> None:
    from recserve.devices import serving_device
    from recserve.serving.triton_repository.layouts import write_repository
    from recserve.serving.triton_repository.repository_settings import RepositorySettings

    device = serving_device(manifest.device)
    count = instances or PACKAGE_INSTANCES[device]
    # Triton's own backends run it (the container has no recserve backend): nothing to install. An ONNX
    # graph has one backend, onnxruntime; TorchScript goes to Triton's PyTorch backend on GPUs too.
    runtime = None if manifest.native_model == NATIVE_ONNX_FILE else "pytorch"
    settings = RepositorySettings(
        device=device, instance_count=count, native_instance_count=count, native_runtime=runtime
    )
    write_repository(export_dir, root, ("native",), settings)
    (root / REPOSITORY_FILE).unlink(missing_ok=True)  # the container expects model folders only


@dataclass(frozen=True)
class PackageInfo:
    """What a model.tar.gz holds, read in one pass (a package's gzip stream is read whole to list it)."""

    runtime: str  # pytorch (code/inference.py inside) or triton (one model folder)
    model: str | None  # triton: the one model folder, what SAGEMAKER_TRITON_DEFAULT_MODEL_NAME names
    config: str | None  # triton: that model's config.pbtxt

    def triton_model(self, package_path: Path) -> str:
        """The one model folder of a triton-runtime package.

        Raises:
            ServingError: a pytorch package.
        """
        if self.model is None:
            raise ServingError(
                f"{package_path}: not a triton-runtime package (it holds code/{ENTRY_POINT}: a pytorch one); "
                "package it with --runtime triton"
            )
        return self.model

    @property
    def on_gpus(self) -> bool:
        """Whether the triton package's model runs in GPU instances (False for a pytorch package)."""
        from recserve.serving.triton_repository.pbtxt import parse_pbtxt
        from recserve.serving.triton_server.bundle import on_gpus

        return self.runtime == "triton" and on_gpus(parse_pbtxt(self.config or ""))

    def native_shape(self, package_path: Path) -> NativeShape:
        """What the triton package's native model takes (history length, padding, max_k).

        Raises:
            ServingError: a pytorch package, or a model that is not the native layout's.
        """
        from google.protobuf.json_format import MessageToDict

        from recserve.artifacts.served import NativeShape
        from recserve.serving.triton_repository.pbtxt import parse_pbtxt

        config = parse_pbtxt(self.config or "") if self.runtime == "triton" else None
        shape = NativeShape.from_config(MessageToDict(config, preserving_proto_field_name=True)) if config else None
        if shape is None:
            raise ServingError(f"{package_path}: {self.model or 'its model'} is not the native layout's model")
        return shape


def inspect_package(package_path: Path) -> PackageInfo:
    """The package's runtime, and for triton its model and config, from one read of the archive.

    Raises:
        ServingError: not a readable model.tar.gz, or neither runtime's layout (naming what it holds).
    """
    names, configs = [], {}
    try:
        with tarfile.open(package_path, "r|gz") as tar:  # streamed: one pass
            for member in tar:
                name = member.name.removeprefix("./")
                names.append(name)
                if member.isfile() and len(Path(name).parts) == 2 and name.endswith("/config.pbtxt"):
                    extracted = tar.extractfile(member)
                    configs[Path(name).parts[0]] = extracted.read().decode() if extracted else ""
    except (tarfile.TarError, OSError) as err:
        raise ServingError(f"{package_path}: not a readable model.tar.gz ({err})") from err
    if f"code/{ENTRY_POINT}" in names:
        return PackageInfo("pytorch", None, None)
    tops = {Path(name).parts[0] for name in names if Path(name).parts}
    models = sorted(t for t in tops if t != "code" and "." not in t)
    if len(models) != 1 or "code" in tops:
        raise ServingError(
            f"{package_path}: not a triton-runtime package (one model folder at the top, found "
            f"{', '.join(sorted(tops)) or 'nothing'}); package it with --runtime triton"
        )
    return PackageInfo("triton", models[0], configs.get(models[0]))


def triton_model_name(package_path: Path) -> str:
    """The one model folder of a triton-runtime package: what SAGEMAKER_TRITON_DEFAULT_MODEL_NAME names.

    Raises:
        ServingError: a package that is not a triton-runtime one.
    """
    return inspect_package(package_path).triton_model(package_path)


def copy_package(target: Path) -> None:
    """Copies recserve's own source into ``target/recserve`` (the containers do not install it)."""
    import recserve

    source = Path(recserve.__file__).parent
    shutil.copytree(source, target / "recserve", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def unpack(package_path: Path, target: Path) -> Path:
    """Extracts a model.tar.gz into ``target`` (refusing members that would land outside it)."""
    package_path = Path(package_path)
    if not package_path.is_file():
        raise ServingError(f"{package_path}: no such package; write one with `recserve sagemaker package`")
    target.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(package_path, "r:gz") as tar:
            tar.extractall(target, filter="data")
    except (tarfile.TarError, OSError) as err:
        raise ServingError(f"{package_path}: not a readable model.tar.gz ({err})") from err
    return target
