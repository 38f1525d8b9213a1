"""What an export backend is: a module with ``PORTABLE``, ``save`` and ``load`` (no torch import here).

A backend module (``recserve.export.backends.MODULES`` names them) provides:

``PORTABLE: bool``
    True when an export built on one device loads on another (eager, compile, torchscript, onnx); False
    when it is compiled for the device it was built on (aoti, cudagraph, torch_tensorrt).

``save(run_dir, spec, out, manifest) -> dict``
    Writes the backend's files into the folder ``out`` (which already holds the item table, popularity and
    model config) from the training run ``run_dir``, for ``spec`` (``recserve.export.graph.GraphSpec``) and
    the settings in ``manifest`` (an ``ExportManifest`` without validation yet). Returns the manifest fields
    it adds (``manifest.BACKEND_FIELDS``): ``fixed_length`` (a backend compiled for one padded history
    length), ``batch_buckets``, ``native_model`` and ``seed_model`` (files of the native and seed layouts'
    models); an empty dict when none. Raises ``ExportError`` for a request it cannot build (wrong device or precision).

``load(out, spec, manifest, device) -> Runner``
    The export in ``out`` as a runner on ``device`` (cpu, cuda or cuda:N).

A ``Runner`` is ``(ids, lengths, exclude_seen, k=None) -> (top_ids, top_scores)``: ``ids`` (B, L) int64
left-padded histories, ``lengths`` (B,) int64, ``exclude_seen`` (B,) bool, ``k`` the batch's largest k (None:
the export's ``max_k``); it returns (B, K) int64 and (B, K) float32 numpy arrays, best first, K at least k.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from recserve.artifacts.export_manifest import ExportManifest
    from recserve.export.spec import GraphSpec

Runner = Callable[..., tuple[np.ndarray, np.ndarray]]


class Backend(Protocol):
    PORTABLE: bool

    def save(self, run_dir: Path, spec: GraphSpec, out: Path, manifest: ExportManifest) -> dict[str, Any]: ...

    def load(self, out: Path, spec: GraphSpec, manifest: ExportManifest, device: str) -> Runner: ...
