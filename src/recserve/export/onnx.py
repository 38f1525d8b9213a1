"""``onnx``: dynamic batch and length axes, int64 inputs, run with onnxruntime; int8 by its dynamic quantization.

ONNX has no search operator, so sparse integer IDs and string IDs are mapped by the predictor.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from recserve.errors import ExportError
from recserve.export.graph import GraphSpec, build_graph, example_inputs

log = logging.getLogger(__name__)

FILE = "model.onnx"
INPUTS = ("item_ids", "lengths", "exclude_seen")
OUTPUTS = ("top_item_ids", "top_scores")  # ONNX names must differ from the inputs' names


def save(run_dir: Path, spec: GraphSpec, out: Path, manifest: dict) -> None:
    import torch

    precision = manifest["precision"]
    if precision not in ("fp32", "int8"):
        raise ExportError(f"onnx: precision {precision!r} is not offered; use fp32 or int8 (CPU)")
    graph = build_graph(run_dir, spec, manifest["max_k"], "fp32")
    example = example_inputs(spec, batch=4, length=min(spec.window - 1, 9))
    batch, length = torch.export.Dim("batch", min=1, max=65536), torch.export.Dim("length", min=1, max=spec.window - 1)
    target = out / (FILE if precision == "fp32" else "model.fp32.onnx")
    torch.onnx.export(
        graph, example, target, input_names=list(INPUTS), output_names=list(OUTPUTS), dynamo=True,
        dynamic_shapes={"item_ids": {0: batch, 1: length}, "lengths": {0: batch}, "exclude_seen": {0: batch}},
        optimize=True, verbose=False,
    )
    if precision == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(target, out / FILE, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"])
        target.unlink()
    for extra in out.glob("*.onnx.data"):
        log.debug("external weights in %s", extra)


def load(out: Path, spec: GraphSpec, manifest: dict, device: str):
    import onnxruntime as ort

    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device.startswith("cuda") else ["CPUExecutionProvider"]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)  # the server sets one per model instance
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # idle threads must not spin: they share the cores with the server and the other instances
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(out / FILE), options, providers=providers)

    def run(ids: np.ndarray, lengths: np.ndarray, exclude: np.ndarray):
        top_ids, scores = session.run(list(OUTPUTS), dict(zip(INPUTS, (ids, lengths, np.ascontiguousarray(exclude)))))
        return top_ids, scores

    return run
