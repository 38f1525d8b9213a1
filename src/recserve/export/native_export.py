"""The native layout's model (``NativeGraph`` as TorchScript or ONNX), its inputs, and its parity check.

The torchscript and onnx backends write it beside their own model when the catalogue allows it
(``unsupported``); the manifest names the file (``native_model``), and the exporter checks its answers
against eager fp32 before the export is written.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from recserve.constants import NATIVE_ONNX_FILE, NATIVE_PAD_ID
from recserve.export.spec import GraphSpec

NativeFn = Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]  # (ids, k, exclude_seen[, *rules])


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
