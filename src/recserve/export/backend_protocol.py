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

A ``Runner`` is ``(ids, lengths, exclude_seen, masks=None, mask_of_row=None, excluded=None, included=None, k=None) ->
(top_ids, top_scores)``: ``ids`` (B, L) int64 left-padded histories, ``lengths`` (B,) int64, ``exclude_seen``
(B,) bool, the business rules as ``models.serving_graph.allowed_items`` takes them (left out: every item
allowed, ``rule_inputs``), ``k`` the batch's largest k (None: the export's ``max_k``); it returns (B, K)
int64 and (B, K) float32 numpy arrays, best first, K at least k (-inf past the items the rules allow).
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


def changed_rows(masks: np.ndarray, earlier: np.ndarray | None) -> np.ndarray | None:
    """The rows of ``masks`` that differ from ``earlier``, where the masks can say (a rule book's hand-outs,
    ``rules.rule_book.Masks``), else None: a device copy of ``earlier`` is then made whole again."""
    since = getattr(masks, "rows_changed_since", None)
    return None if since is None or earlier is None else since(earlier)


def rule_inputs(
    num_items: int,
    batch: int,
    masks: np.ndarray | None = None,
    mask_of_row: np.ndarray | None = None,
    excluded: np.ndarray | None = None,
    included: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The graph's rule inputs (``serving_graph.allowed_items``), each as given or, left out, the rule that
    lets every item through: one mask of every item but padding and the mask token, no item excluded, no
    list to keep to."""
    if masks is None:
        masks = np.ones((1, num_items + 2), dtype=bool)
        masks[0, [0, num_items + 1]] = False
    if mask_of_row is None:
        mask_of_row = np.zeros(batch, dtype=np.int64)
    if excluded is None:
        excluded = np.zeros((batch, 1), dtype=np.int64)
    if included is None:
        included = np.zeros((batch, 1), dtype=np.int64)
    return masks, mask_of_row, excluded, included
