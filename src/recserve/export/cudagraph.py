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

from recserve.constants import MODEL_CONFIG_FILE, WEIGHTS_FILE
from recserve.errors import ExportError
from recserve.export.graph import GraphSpec, build_graph

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def save(run_dir: Path, spec: GraphSpec, out: Path, manifest: dict) -> None:
    if not str(manifest["device"]).startswith("cuda"):
        raise ExportError("backend cudagraph needs a GPU (--device cuda); on a CPU use onnx")
    manifest["fixed_length"] = spec.window - 1
    manifest["batch_buckets"] = list(BUCKETS)
    for name in (WEIGHTS_FILE, MODEL_CONFIG_FILE):
        shutil.copyfile(Path(run_dir) / name, out / name)


class CudaGraphRunner:
    """Replays the captured graph of the smallest bucket that holds the batch."""

    def __init__(self, module: torch.nn.Module, device: str, length: int, buckets=BUCKETS):
        self.module = module  # the graphs read its weights in place: it must live as long as they do
        self.device = torch.device(device)
        self.buckets = buckets
        self.graphs, self.inputs, self.outputs = {}, {}, {}
        pool = None
        stream = torch.cuda.Stream(self.device)
        with torch.inference_mode():
            for batch in sorted(buckets, reverse=True):  # largest first: smaller ones reuse its memory pool
                static = (torch.zeros(batch, length, dtype=torch.int64, device=self.device),
                          torch.zeros(batch, dtype=torch.int64, device=self.device),
                          torch.ones(batch, dtype=torch.bool, device=self.device))
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    for _ in range(2):  # warm-up outside the capture (allocations, lazy init)
                        module(*static)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[batch] = module(*static)
                pool = graph.pool()
                self.graphs[batch], self.inputs[batch] = graph, static
            self.host = {b: tuple(torch.empty(t.shape, dtype=t.dtype).pin_memory() for t in self.inputs[b]) for b in buckets}

    def __call__(self, ids: np.ndarray, lengths: np.ndarray, exclude: np.ndarray):
        with torch.inference_mode():  # the static tensors were made in inference mode
            return self._run(ids, lengths, exclude)

    def _run(self, ids: np.ndarray, lengths: np.ndarray, exclude: np.ndarray):
        if len(ids) > self.buckets[-1]:
            parts = [self._run(ids[i : i + self.buckets[-1]], lengths[i : i + self.buckets[-1]], exclude[i : i + self.buckets[-1]])
                     for i in range(0, len(ids), self.buckets[-1])]
            return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        n = len(ids)
        batch = next(b for b in self.buckets if b >= n)
        host = self.host[batch]
        for buffer, value in zip(host, (ids, lengths, exclude)):
            buffer[:n].copy_(torch.from_numpy(np.ascontiguousarray(value)))
            buffer[n:].zero_()
        for static, buffer in zip(self.inputs[batch], host):
            static.copy_(buffer, non_blocking=True)
        self.graphs[batch].replay()
        top_ids, scores = self.outputs[batch]
        return top_ids[:n].cpu().numpy(), scores[:n].float().cpu().numpy()


def load(out: Path, spec: GraphSpec, manifest: dict, device: str):
    if not str(device).startswith("cuda"):
        raise ExportError("backend cudagraph runs on a GPU only")
    module = build_graph(out, spec, manifest["max_k"], manifest["precision"]).to(device)
    return CudaGraphRunner(module, device, manifest["fixed_length"], tuple(manifest["batch_buckets"]))
