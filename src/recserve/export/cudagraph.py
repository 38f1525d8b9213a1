"""``cudagraph``: the eager graph captured as CUDA graphs, one per batch-size bucket, at a fixed length.

Eager PyTorch spends milliseconds launching a small transformer's hundred kernels one by one; a replayed
CUDA graph launches them all at once. Requests are padded to the full window and batches to the next
bucket (padding rows are empty histories, whose answers are dropped).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch

from recserve.artifacts.export_manifest import ExportManifest
from recserve.constants import MAX_RULE_MASKS, MODEL_CONFIG_FILE, WEIGHTS_FILE
from recserve.errors import ExportError
from recserve.export.backend_protocol import Runner, changed_rows, rule_inputs
from recserve.export.graph import GraphSpec, build_graph

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


PORTABLE = False  # captured on a GPU


def save(run_dir: Path, spec: GraphSpec, out: Path, manifest: ExportManifest) -> dict:
    if not manifest.device.startswith("cuda"):
        raise ExportError("backend cudagraph needs a GPU (--device cuda); on a CPU use onnx")
    for name in (WEIGHTS_FILE, MODEL_CONFIG_FILE):
        shutil.copyfile(Path(run_dir) / name, out / name)
    return {"fixed_length": spec.window - 1, "batch_buckets": BUCKETS}


LISTED_COLUMNS = 128  # excluded, and included, items a row may bring to a captured graph (more: it runs uncaptured)


class _Packed(torch.nn.Module):
    """The graph with one packed input, so that a call needs one host-to-device copy, and the rules' masks in
    a device buffer of their own, copied again only when they change.

    Column layout of ``packed`` (B, L + 3 + 2 * LISTED_COLUMNS) int64: the L item IDs, then the length, then
    exclude_seen, then the row's mask, then its excluded items and its included items (padding 0 past each).
    """

    def __init__(self, graph: torch.nn.Module, length: int):
        super().__init__()
        self.graph, self.length = graph, length

    def forward(self, packed: torch.Tensor, masks: torch.Tensor):
        n, listed = self.length, LISTED_COLUMNS
        return self.graph(
            packed[:, :n],
            packed[:, n],
            packed[:, n + 1] != 0,
            masks,
            packed[:, n + 2],
            packed[:, n + 3 : n + 3 + listed],
            packed[:, n + 3 + listed :],
        )


class CudaGraphRunner:
    """Replays the captured graph of the smallest bucket that holds the batch.

    A call is one copy in, one replay, two copies out and one synchronisation; the host buffers are pinned
    and filled through numpy views, so the per-call Python work stays small.
    """

    def __init__(self, module: torch.nn.Module, device: str, length: int, num_items: int, buckets=BUCKETS):
        self.module = _Packed(module, length)  # the graphs read its weights in place: it must outlive them
        self.device = torch.device(device)
        self.buckets, self.length, self.num_items = tuple(buckets), length, num_items
        self.columns = length + 3 + 2 * LISTED_COLUMNS
        self.masks = torch.zeros(MAX_RULE_MASKS + 1, num_items + 2, dtype=torch.bool, device=self.device)
        self.masks_from: np.ndarray | None = None  # the caller's masks the buffer holds
        self.graphs, self.inputs, self.outputs, self.host = {}, {}, {}, {}
        pool = None
        stream = torch.cuda.Stream(self.device)
        with torch.inference_mode():
            for batch in sorted(self.buckets, reverse=True):  # largest first: smaller ones reuse its memory pool
                static = torch.zeros(batch, self.columns, dtype=torch.int64, device=self.device)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    for _ in range(2):  # warm-up outside the capture (allocations, lazy init)
                        self.module(static, self.masks)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    top_ids, scores = self.module(static, self.masks)
                pool = graph.pool()
                self.graphs[batch], self.inputs[batch], self.outputs[batch] = graph, static, (top_ids, scores)
                host_in = torch.zeros(static.shape, dtype=torch.int64).pin_memory()
                host_ids = torch.empty(top_ids.shape, dtype=top_ids.dtype).pin_memory()
                host_scores = torch.empty(scores.shape, dtype=torch.float32).pin_memory()
                self.host[batch] = (host_in, host_ids, host_scores)

    def __call__(
        self,
        ids: np.ndarray,
        lengths: np.ndarray,
        exclude: np.ndarray,
        *rules: np.ndarray,
        k: int | None = None,
    ):
        """Runs the captured graph of the smallest bucket that fits; always returns ``max_k`` columns."""
        masks, mask_of_row, excluded, included = rule_inputs(self.num_items, len(ids), *rules)
        rows = (ids, lengths, exclude, mask_of_row, excluded, included)
        with torch.inference_mode():  # the static tensors were made in inference mode
            if len(masks) > len(self.masks):  # more rules in one batch than the captured graphs hold
                return self._uncaptured(*rows, masks=torch.tensor(masks, device=self.device))
            self._hold(masks)
            if max(excluded.shape[1], included.shape[1]) > LISTED_COLUMNS:  # wider than the captured graphs take
                return self._uncaptured(*rows)
            if len(ids) <= self.buckets[-1]:
                return self._run(*rows)
            step = self.buckets[-1]
            parts = [self._run(*(a[i : i + step] for a in rows)) for i in range(0, len(ids), step)]
            return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _hold(self, masks: np.ndarray) -> None:
        """The masks into the graphs' buffer, where they are not already there."""
        if masks is self.masks_from:
            return
        rows = changed_rows(masks, self.masks_from)
        plain = np.asarray(masks)
        if rows is None:
            self.masks[: len(plain)].copy_(torch.tensor(plain))  # read-only: copied
        elif len(rows):  # the book says which rows changed since the masks the buffer holds
            self.masks[torch.from_numpy(rows).to(self.device)] = torch.from_numpy(plain[rows]).to(self.device)
        self.masks_from = masks

    def _uncaptured(self, ids, lengths, exclude, mask_of_row, excluded, included, masks=None):
        on = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(self.device)  # noqa: E731
        masks = self.masks if masks is None else masks
        top_ids, scores = self.module.graph(
            on(ids), on(lengths), on(exclude), masks, on(mask_of_row), on(excluded), on(included)
        )
        return top_ids.cpu().numpy(), scores.float().cpu().numpy()

    def _run(self, ids, lengths, exclude, mask_of_row, excluded, included):
        n, listed = len(ids), self.length + 3
        batch = next(b for b in self.buckets if b >= n)
        host_in, host_ids, host_scores = self.host[batch]
        packed = host_in.numpy()
        packed[:n, : self.length] = ids
        packed[:n, self.length] = lengths
        packed[:n, self.length + 1] = exclude
        packed[:n, self.length + 2] = mask_of_row
        packed[:n, listed:] = 0
        packed[:n, listed : listed + excluded.shape[1]] = excluded
        packed[:n, listed + LISTED_COLUMNS : listed + LISTED_COLUMNS + included.shape[1]] = included
        packed[n:, self.length] = 0  # padding rows: empty histories (their stale IDs are masked out)
        packed[n:, self.length + 2] = 0
        self.inputs[batch].copy_(host_in, non_blocking=True)
        self.graphs[batch].replay()
        top_ids, scores = self.outputs[batch]
        host_ids.copy_(top_ids, non_blocking=True)
        host_scores.copy_(scores, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return host_ids.numpy()[:n].copy(), host_scores.numpy()[:n].copy()


def load(out: Path, spec: GraphSpec, manifest: ExportManifest, device: str) -> Runner:
    if not str(device).startswith("cuda"):
        raise ExportError("backend cudagraph runs on a GPU only")
    module = build_graph(out, spec, manifest.max_k, manifest.precision, manifest.explore_new).to(device)
    length = manifest.fixed_length if manifest.fixed_length is not None else spec.window - 1
    return CudaGraphRunner(module, device, length, len(spec.vocab_ids), manifest.batch_buckets)
