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
from recserve.constants import MODEL_CONFIG_FILE, WEIGHTS_FILE
from recserve.errors import ExportError
from recserve.export.backend_protocol import Runner
from recserve.export.graph import GraphSpec, build_graph

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


PORTABLE = False  # captured on a GPU


def save(run_dir: Path, spec: GraphSpec, out: Path, manifest: ExportManifest) -> dict:
    if not manifest.device.startswith("cuda"):
        raise ExportError("backend cudagraph needs a GPU (--device cuda); on a CPU use onnx")
    for name in (WEIGHTS_FILE, MODEL_CONFIG_FILE):
        shutil.copyfile(Path(run_dir) / name, out / name)
    return {"fixed_length": spec.window - 1, "batch_buckets": BUCKETS}


class _Packed(torch.nn.Module):
    """The graph with one packed input, so that a call needs one host-to-device copy.

    Column layout of ``packed`` (B, L + 2) int64: the L item IDs, then the length, then exclude_seen.
    """

    def __init__(self, graph: torch.nn.Module, length: int):
        super().__init__()
        self.graph, self.length = graph, length

    def forward(self, packed: torch.Tensor):
        return self.graph(packed[:, : self.length], packed[:, self.length], packed[:, self.length + 1] != 0)


class CudaGraphRunner:
    """Replays the captured graph of the smallest bucket that holds the batch.

    A call is one copy in, one replay, two copies out and one synchronisation; the host buffers are pinned
    and filled through numpy views, so the per-call Python work stays small.
    """

    def __init__(self, module: torch.nn.Module, device: str, length: int, buckets=BUCKETS):
        self.module = _Packed(module, length)  # the graphs read its weights in place: it must outlive them
        self.device = torch.device(device)
        self.buckets, self.length = tuple(buckets), length
        self.graphs, self.inputs, self.outputs, self.host = {}, {}, {}, {}
        pool = None
        stream = torch.cuda.Stream(self.device)
        with torch.inference_mode():
            for batch in sorted(self.buckets, reverse=True):  # largest first: smaller ones reuse its memory pool
                static = torch.zeros(batch, length + 2, dtype=torch.int64, device=self.device)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    for _ in range(2):  # warm-up outside the capture (allocations, lazy init)
                        self.module(static)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    top_ids, scores = self.module(static)
                pool = graph.pool()
                self.graphs[batch], self.inputs[batch], self.outputs[batch] = graph, static, (top_ids, scores)
                host_in = torch.zeros(static.shape, dtype=torch.int64).pin_memory()
                host_ids = torch.empty(top_ids.shape, dtype=top_ids.dtype).pin_memory()
                host_scores = torch.empty(scores.shape, dtype=torch.float32).pin_memory()
                self.host[batch] = (host_in, host_ids, host_scores)

    def __call__(self, ids: np.ndarray, lengths: np.ndarray, exclude: np.ndarray, k: int | None = None):
        """Runs the captured graph of the smallest bucket that fits; always returns ``max_k`` columns."""
        with torch.inference_mode():  # the static tensors were made in inference mode
            if len(ids) <= self.buckets[-1]:
                return self._run(ids, lengths, exclude)
            step = self.buckets[-1]
            parts = [
                self._run(ids[i : i + step], lengths[i : i + step], exclude[i : i + step])
                for i in range(0, len(ids), step)
            ]
            return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _run(self, ids: np.ndarray, lengths: np.ndarray, exclude: np.ndarray):
        n = len(ids)
        batch = next(b for b in self.buckets if b >= n)
        host_in, host_ids, host_scores = self.host[batch]
        packed = host_in.numpy()
        packed[:n, : self.length] = ids
        packed[:n, self.length] = lengths
        packed[:n, self.length + 1] = exclude
        packed[n:, self.length] = 0  # padding rows: empty histories (their stale IDs are masked out)
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
    module = build_graph(out, spec, manifest.max_k, manifest.precision).to(device)
    length = manifest.fixed_length if manifest.fixed_length is not None else spec.window - 1
    return CudaGraphRunner(module, device, length, manifest.batch_buckets)
