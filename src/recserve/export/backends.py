"""The export backends by name, and loading any export folder as a predictor runner."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np

from recserve.constants import ITEM_TABLE_FILE, POPULARITY_FILE
from recserve.errors import ExportError
from recserve.export.graph import GraphSpec

# backend -> module under recserve.export that has save() and load()
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


def backend_module(backend: str):
    if backend not in MODULES:
        raise ExportError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    return importlib.import_module(f"recserve.export.{MODULES[backend]}")


def spec_of(export_dir: Path, manifest: dict) -> GraphSpec:
    ids = np.load(Path(export_dir) / ITEM_TABLE_FILE, allow_pickle=False)
    popularity = np.load(Path(export_dir) / POPULARITY_FILE, allow_pickle=False)
    return GraphSpec(ids, popularity, manifest["window"], manifest.get("model", "bert4rec"), manifest["id_mapping"])


def load_runner(export_dir: Path, manifest: dict, device: str = "cpu"):
    """The runner of an export folder (see ``recserve.serving.predictor.Runner``)."""
    return backend_module(manifest["backend"]).load(Path(export_dir), spec_of(export_dir, manifest), manifest, device)
