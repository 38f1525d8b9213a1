"""The export backends by name (each a ``recserve.export.backend_protocol.Backend``), and loading an export folder."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import cast

from recserve.artifacts.catalogue import read_catalogue
from recserve.artifacts.export_manifest import ExportManifest
from recserve.artifacts.popularity import read_popularity
from recserve.errors import ExportError
from recserve.export.backend_protocol import Backend, Runner
from recserve.export.spec import GraphSpec

# backend -> module under recserve.export that has PORTABLE, save() and load()
MODULES = {
    "eager": "eager",
    "compile": "eager",
    "torchscript": "torchscript",
    "onnx": "onnx",
    "aoti": "aoti",
    "cudagraph": "cudagraph",
    "torch_tensorrt": "tensorrt",
}
BACKENDS = tuple(MODULES)
# What `recserve export` and `recserve repo --run` build when no backend is named: onnx is the fastest on
# CPUs (docs/benchmarks.md); on GPUs eager runs everywhere (the compiled backends are opt-in).
DEFAULT_BACKEND = {"cpu": "onnx", "cuda": "eager"}


def default_backend(device: str) -> str:
    """The default backend for ``device`` (cpu, cuda or gpu)."""
    return DEFAULT_BACKEND["cpu" if device == "cpu" else "cuda"]


def backend_module(backend: str) -> Backend:
    if backend not in MODULES:
        raise ExportError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    return cast(Backend, importlib.import_module(f"recserve.export.{MODULES[backend]}"))


def spec_of(export_dir: Path, manifest: ExportManifest) -> GraphSpec:
    ids = read_catalogue(export_dir)
    return GraphSpec(ids, read_popularity(export_dir), manifest.window, manifest.model, manifest.id_mapping)


def load_runner(export_dir: Path, manifest: ExportManifest | None = None, device: str = "cpu") -> Runner:
    """The runner of an export folder (see ``recserve.export.backend_protocol``); its manifest is read if not given."""
    manifest = manifest or ExportManifest.read(export_dir)
    return backend_module(manifest.backend).load(Path(export_dir), spec_of(export_dir, manifest), manifest, device)
