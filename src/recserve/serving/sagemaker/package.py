"""``model.tar.gz`` for SageMaker, in the layout each container expects.

- ``pytorch`` (SageMaker's PyTorch inference containers): the export at the top level (eager fp32: rebuilt
  at load, so it runs on CPU or CUDA), ``code/inference.py`` with the four handler functions,
  ``code/requirements.txt`` and a copy of recserve under ``code/``, which the container puts on the path.
- ``triton`` (SageMaker's Triton containers): a model repository whose top-level folder is the ``recommender``
  model (the fused layout over the ONNX export, a copy of recserve beside its ``model.py``); the endpoint
  names it through ``SAGEMAKER_TRITON_DEFAULT_MODEL_NAME``. Its python environment needs numpy < 2 and
  onnxruntime (listed in ``recommender/1/requirements.txt``).
"""

from __future__ import annotations

import json
import logging
import shutil
import tarfile
import tempfile
from pathlib import Path

from recserve.constants import FUSED_MODEL
from recserve.errors import ServingError

log = logging.getLogger(__name__)

RUNTIMES = ("pytorch", "triton")
ENTRY_POINT = "inference.py"
# what each container needs beside the model; the endpoint's environment variables
ENVIRONMENT = {
    "pytorch": {"SAGEMAKER_PROGRAM": ENTRY_POINT},
    "triton": {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": FUSED_MODEL},
}
HANDLER_SHIM = '''"""SageMaker entry point written by `recserve sagemaker package`; the handler lives in recserve."""

from recserve.serving.sagemaker.inference import (  # noqa: F401
    input_fn,
    install_short_error_bodies,
    model_fn,
    output_fn,
    predict_fn,
)

install_short_error_bodies()
'''
REQUIREMENTS = "numpy>=1.24,<2\n"  # torch comes with the container


def package(run_dir: Path, runtime: str, out: Path) -> dict:
    """Writes ``out`` (a model.tar.gz) for ``runtime``; returns what it holds and the environment to set."""
    if runtime not in RUNTIMES:
        raise ServingError(f"runtime {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    out = Path(out)
    if not out.name.endswith(".tar.gz"):
        raise ServingError(f"{out}: the package must be a .tar.gz file (SageMaker reads model.tar.gz)")
    with tempfile.TemporaryDirectory(prefix="recserve-package-") as tmp:
        root = Path(tmp) / "model"
        root.mkdir()
        manifest = _write_pytorch(run_dir, root) if runtime == "pytorch" else _write_triton(run_dir, root)
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f".{out.name}.partial")
        with tarfile.open(partial, "w:gz") as tar:
            for path in sorted(root.rglob("*")):
                if "__pycache__" not in path.parts:
                    tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
        partial.rename(out)
    return {"package": str(out), "runtime": runtime, "model": manifest["model"], "backend": manifest["backend"],
            "environment": ENVIRONMENT[runtime], "bytes": out.stat().st_size}


def _write_pytorch(run_dir: Path, root: Path) -> dict:
    from recserve.export.exporter import export_run

    staging = root.parent / "export"
    manifest = export_run(run_dir, "eager", "fp32", staging)
    for path in staging.iterdir():
        path.rename(root / path.name)
    code = root / "code"
    code.mkdir()
    (code / ENTRY_POINT).write_text(HANDLER_SHIM)
    (code / "requirements.txt").write_text(REQUIREMENTS)
    copy_package(code)
    return manifest


def _write_triton(run_dir: Path, root: Path) -> dict:
    from recserve.serving.triton.repository import write_repository

    write_repository(run_dir, root, ("fused",), backend="onnx")
    (root / "recserve.json").unlink(missing_ok=True)  # the container expects model folders only
    version = root / FUSED_MODEL / "1"
    copy_package(version)
    (version / "requirements.txt").write_text(REQUIREMENTS + "onnxruntime>=1.18\n")
    return json.loads((version / "export" / "export.json").read_text())


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
