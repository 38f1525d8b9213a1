"""The native layout's model (``NativeGraph`` as TorchScript or ONNX), its inputs, and its parity check.

The torchscript and onnx backends write it beside their own model when the catalogue allows it
(``unsupported``); the manifest names the file (``native_model``), and the exporter checks its answers
against eager fp32 before the export is written.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from recserve.constants import NATIVE_ONNX_FILE, NATIVE_PAD_ID
from recserve.errors import ExportError
from recserve.export.spec import GraphSpec

NativeFn = Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]  # (ids, k, exclude_seen[, *rules])
CAPTURED_BATCHES = (1, 4)  # a GPU export's native model captured at these before the export is written


def unsupported(spec: GraphSpec) -> str | None:
    """Why the export's catalogue cannot be served by a native model, or None when it can."""
    if spec.vocab_ids.dtype.kind not in "iu":
        return "string IDs cannot be tensors in a TorchScript or ONNX graph: serve them with the fused layout"
    if spec.id_mapping != "graph":
        return "ONNX has no search operator for sparse integer IDs: export with --backend torchscript"
    if np.any(spec.vocab_ids == NATIVE_PAD_ID):
        return (
            f"the catalogue holds the ID {NATIVE_PAD_ID}, the native layout's padding: serve it with the fused layout"
        )
    return None


def padded(ids: np.ndarray, lengths: np.ndarray, length: int) -> np.ndarray:
    """Left-padded histories (B, L) with their lengths, as the native model takes them: (B, ``length``),
    the most recent ``length`` IDs of each, ``NATIVE_PAD_ID`` before them."""
    ids = np.asarray(ids, dtype=np.int64)
    batch, width = ids.shape
    if width < length:
        ids = np.concatenate([np.full((batch, length - width), NATIVE_PAD_ID, dtype=np.int64), ids], axis=1)
    keep = np.minimum(np.asarray(lengths), length)
    return np.where(np.arange(length)[None, :] >= (length - keep)[:, None], ids[:, -length:], NATIVE_PAD_ID)


def example(batch: int, length: int, spec: GraphSpec, seed: int = 0):
    """Native inputs (item IDs, k, exclude_seen) as torch tensors, for tracing and exporting."""
    import torch

    from recserve.export.graph import example_inputs

    ids, lengths, exclude = (t.numpy() for t in example_inputs(spec, batch, length, seed=seed)[:3])
    k = np.full((batch, 1), 10, dtype=np.int32)
    return (
        torch.from_numpy(padded(ids, lengths, length)),
        torch.from_numpy(k),
        torch.from_numpy(exclude[:, None].copy()),
    )


def as_runner(native: NativeFn, length: int, max_k: int):
    """The native model as an export ``Runner`` (fused-graph inputs, the business rules after them where
    given: its ``ruled`` method), for ``validate.check_parity``."""

    def run(ids: np.ndarray, lengths: np.ndarray, exclude: np.ndarray, *rules: np.ndarray, k: int | None = None):
        ks = np.full((len(ids), 1), max_k if k is None else k, dtype=np.int32)
        top_ids, scores, _ = native(padded(ids, lengths, length), ks, np.ascontiguousarray(exclude)[:, None], *rules)
        return top_ids, scores

    return run


def load(export_dir: Path, file: str, device: str = "cpu") -> NativeFn:
    """The native model file of an export, run in this process (torch for .pt, onnxruntime for .onnx)."""
    path = Path(export_dir) / file
    if file == NATIVE_ONNX_FILE:
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]

        def run_onnx(ids, k, exclude, *rules):
            if rules:
                raise ValueError("an ONNX native model takes no business rules")
            ids, scores, unknown = session.run(None, dict(zip(names, (ids, k, exclude))))
            return ids, scores, unknown

        return run_onnx
    import torch

    module = torch.jit.load(str(path), map_location=device).eval()

    def run_torch(ids, k, exclude, *rules):
        method = module.ruled if rules else module.forward  # ruled: under business rules (``NativeGraph``)
        with torch.inference_mode(), torch.jit.optimized_execution(False):  # as Triton's backends run it
            out = method(*(torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in (ids, k, exclude, *rules)))
        return tuple(t.cpu().numpy() if t.dtype != torch.bfloat16 else t.float().cpu().numpy() for t in out)

    return run_torch


def captured(fn: Callable[[], object], warmups: int = 3):
    """``fn`` captured as a CUDA graph, as recserve's backend captures a native model: called ``warmups`` times
    on a side stream first (allocations, lazy initialisation), then recorded. Returns the graph and what the
    recorded call returned (the graph's own tensors, which each replay writes again)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def check_capture(export_dir: Path, file: str, spec: GraphSpec, device: str, ruled: bool) -> list[str]:
    """A GPU's native TorchScript model captured as CUDA graphs, as recserve's backend captures it when it
    loads it: ``forward`` (and ``ruled``) at each of ``CAPTURED_BATCHES``, replayed, its scores the uncaptured
    call's. A graph that reads a value back to the host mid-call (a size computed on the device, a
    data-dependent shape) cannot be captured, and the backend would refuse to load it: the export is refused
    instead. Returns what was captured, as "forward@1".

    Raises:
        ExportError: a method could not be captured, or its replay answered other than the call.
    """
    import torch

    from recserve.export.graph import example_inputs

    module = torch.jit.load(str(Path(export_dir) / file), map_location=device).eval()
    done = []
    for batch in CAPTURED_BATCHES:
        inputs = tuple(t.to(device) for t in example(batch, spec.window - 1, spec, seed=batch))
        rules = tuple(t.to(device) for t in example_inputs(spec, batch, 1, seed=batch)[3:])
        calls = {"forward": (module.forward, inputs)} | ({"ruled": (module.ruled, inputs + rules)} if ruled else {})
        for name, (method, args) in calls.items():
            with torch.inference_mode(), torch.jit.optimized_execution(False):  # as Triton's backends run it
                called = method(*args)
                try:
                    graph, replayed = captured(functools.partial(method, *args))
                    graph.replay()
                    torch.cuda.synchronize(device)
                except RuntimeError as error:
                    raise ExportError(
                        f"the native model's {name} cannot be captured as a CUDA graph at batch {batch}, so "
                        f"recserve's backend could not load it: {_capture_failure(error)}"
                    ) from error
            if not torch.allclose(replayed[1].float(), called[1].float(), rtol=1e-3, atol=1e-3):
                raise ExportError(
                    f"the native model's {name} captured at batch {batch} answers other scores than called: "
                    "recserve's backend would serve the captured ones"
                )
            done.append(f"{name}@{batch}")
    return done


def _capture_failure(error: RuntimeError) -> str:
    """What a failed capture says in one line: the CUDA error, and the TorchScript line that met it, where the
    interpreter's traceback names one (the line before its "<--- HERE")."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    reason = next((line.removeprefix("RuntimeError: ") for line in lines if line.startswith("RuntimeError:")), None)
    reason = reason or (lines[0] if lines else type(error).__name__)
    at = [lines[i - 1] for i, line in enumerate(lines) if "<--- HERE" in line and i > 0]
    return reason + (f" (at `{at[-1]}`)" if at else "")
