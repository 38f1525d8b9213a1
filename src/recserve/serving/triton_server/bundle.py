"""The Triton server of the nvidia-pytriton wheel and recserve's backend folder for it: the bundle's
backends linked in, the python-backend stub for this Python copied beside them, and the native backends
built from source (``scripts/build_triton_backends.sh``); which backends a repository's models need, checked
before the server starts."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recserve.errors import ServingError
from recserve.files import cache_dir, private_dir

log = logging.getLogger(__name__)
SECRET_MARK = "@RECSERVE_SECRET@"  # argv_secret.c's MARK: where the admin key goes, for main alone
SECRET_ENV = "RECSERVE_ARGV_SECRET"


@dataclass(frozen=True)
class Bundle:
    """Where the Triton server of the nvidia-pytriton wheel lives."""

    binary: Path
    backend_dir: Path
    libs: Path


def find_bundle() -> Bundle:
    """Locates the server; ``TRITONSERVER_BIN`` and ``TRITON_BACKEND_DIR`` override the wheel's copy."""
    if os.environ.get("TRITONSERVER_BIN"):
        binary = Path(os.environ["TRITONSERVER_BIN"])
        backend_dir = Path(os.environ.get("TRITON_BACKEND_DIR", binary.parent.parent / "backends"))
        return Bundle(binary, backend_dir, binary.parent.parent.parent.parent / "nvidia_pytriton.libs")
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServingError("the Triton server ships in nvidia-pytriton: `pip install nvidia-pytriton==0.7.0`")
    root = Path(next(iter(spec.submodule_search_locations)))
    server = root / "tritonserver"
    return Bundle(server / "bin" / "tritonserver", backend_folder(server), root.parent / "nvidia_pytriton.libs")


def backend_folder(server: Path) -> Path:
    """recserve's own backend folder for the bundled server (the installed package is never written to):
    the bundle's backends linked in, and its python backend with the stub for this Python beside it.

    It lives in recserve's cache folder (``files.cache_dir``).
    """
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServingError(f"the bundled Triton has no python-backend stub for Python {version}")
    folder = cache_dir() / "triton-backends" / f"{server.resolve().as_posix().replace('/', '_')}-py{version}"
    (folder / "python").mkdir(parents=True, exist_ok=True)
    for source in (server / "backends").iterdir():
        if source.name == "python":
            for item in source.iterdir():
                if item.name != stub.name:
                    _link(folder / "python" / item.name, item)
        else:
            _link(folder / source.name, source)
    target = folder / "python" / stub.name
    if not target.is_file() or target.stat().st_size != stub.stat().st_size:
        shutil.copy2(stub, target)
    for native in native_backends():
        _link(folder / native.name, native)
    return folder


def native_backends_link() -> Path:
    """Where ``scripts/build_triton_backends.sh`` leaves a link to its output, in recserve's cache folder: one
    link for each torch installation (the backends are built against it), so that a build in another
    checkout, with its own environment, never repoints this one's."""
    spec = importlib.util.find_spec("torch")
    torch_dir = Path(spec.origin).resolve().parent if spec and spec.origin else Path("no-torch")
    return cache_dir() / f"native-backends{torch_dir.as_posix().replace('/', '_')}"


def native_backends() -> list[Path]:
    """Backends built from source beside the bundled python one: the folders under
    ``RECSERVE_TRITON_BACKENDS``, else where ``scripts/build_triton_backends.sh`` last built them against
    this environment's torch (``native_backends_link``)."""
    root = os.environ.get("RECSERVE_TRITON_BACKENDS")
    folder = Path(root) if root else native_backends_link()
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and any(p.glob("libtriton_*.so")))


PLATFORM_BACKENDS = {"pytorch_libtorch": "pytorch", "onnxruntime_onnx": "onnxruntime"}  # Triton's own mapping


def model_backends(repo: Path) -> list[tuple[str, str, Any]]:
    """(model, the backend its config names, the parsed config) for each model of a repository; a model
    whose config does not parse is left out (the server reports it in its own words)."""
    from recserve.serving.triton_repository.pbtxt import parse_pbtxt

    found = []
    for path in sorted(Path(repo).glob("*/config.pbtxt")):
        try:
            config = parse_pbtxt(path.read_text())
        except Exception:
            continue
        found.append((path.parent.name, config.backend or PLATFORM_BACKENDS.get(config.platform, ""), config))
    return found


def check_backends(repo: Path, backend_dir: Path) -> None:
    """Refuses, before the server starts, a repository whose models need a backend the folder lacks.

    Raises:
        ServingError: naming the models, their backend and how to build it.
    """
    missing: dict[str, list[str]] = {}
    cpu_only: dict[str, list[str]] = {}
    for model, backend, config in model_backends(repo):
        if backend and not (backend_dir / backend).is_dir():
            missing.setdefault(backend, []).append(model)
        elif backend in CUDA_BUILT and on_gpus(config) and not built_with_cuda(backend_dir / backend):
            cpu_only.setdefault(backend, []).append(model)
    if missing:
        names = "; ".join(f"{', '.join(models)} need(s) Triton's {b} backend" for b, models in missing.items())
        raise ServingError(
            f"{repo}: {names}, which is not in {backend_dir}: build the native backends with "
            "scripts/build_triton_backends.sh (make test does), or set RECSERVE_TRITON_BACKENDS to where they are"
        )
    if cpu_only:
        names = "; ".join(f"{', '.join(models)} run(s) on GPUs on the {b} backend" for b, models in cpu_only.items())
        raise ServingError(
            f"{repo}: {names}, which was built without CUDA ({backend_dir}): rebuild it on this GPU host with "
            "`rm -rf build/triton-backends && scripts/build_triton_backends.sh` (it builds with CUDA where torch "
            "sees a GPU; TRITON_BACKENDS_GPU=1 asks for it)"
        )


KIND_GPU = 1  # inference.ModelInstanceGroup.Kind
CUDA_BUILT = ("pytorch", "recserve")  # the backends whose build says whether it has CUDA (build.json)


def on_gpus(config) -> bool:
    return any(group.kind == KIND_GPU for group in config.instance_group)


def built_with_cuda(folder: Path) -> bool:
    """Whether a backend built by scripts/build_triton_backends.sh has CUDA (its ``build.json``)."""
    try:
        return bool(json.loads((folder / "build.json").read_text()).get("cuda"))
    except (OSError, ValueError):
        return False


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() and link.resolve() == target.resolve():
        return
    link.unlink(missing_ok=True)
    link.symlink_to(target)


def argv_secret_library() -> Path | None:
    """``argv_secret.c`` built for this machine (once, into recserve's cache folder, the user's alone): loaded
    into tritonserver, it gives its main the admin key where the command line holds ``SECRET_MARK``, so that
    the key is not in /proc/PID/cmdline. None, said in the log, where no C compiler is found: the key is then
    on the command line, as Triton takes it."""
    source = Path(__file__).with_name("argv_secret.c")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    built = private_dir(cache_dir() / "argv-secret") / f"argv_secret-{digest}.so"
    if built.is_file():
        return built
    compiler = next((found for name in ("cc", "gcc", "clang") if (found := shutil.which(name))), None)
    if compiler is None:
        log.warning("no C compiler: the server's admin key is on its command line, which local users can read")
        return None
    staging = built.with_suffix(f".{os.getpid()}.tmp")
    result = subprocess.run(
        [compiler, "-O2", "-shared", "-fPIC", "-o", str(staging), str(source)], capture_output=True, text=True
    )
    if result.returncode != 0:
        staging.unlink(missing_ok=True)
        log.warning("argv_secret.c did not build (%s): the admin key is on the server's command line", result.stderr)
        return None
    staging.replace(built)
    return built
