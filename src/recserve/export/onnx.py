"""``onnx``: dynamic batch and length axes, int64 inputs, run with onnxruntime; int8 by its dynamic quantization.

ONNX has no search operator, so sparse integer IDs and string IDs are mapped by the predictor. Loading needs
numpy and onnxruntime only (no torch): what a Triton image serving the fused layout over ONNX installs.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from recserve.errors import ExportError
from recserve.export.manifest import ExportManifest
from recserve.export.protocol import Runner
from recserve.export.spec import GraphSpec

log = logging.getLogger(__name__)

FILE = "model.onnx"
INPUTS = ("item_ids", "lengths", "exclude_seen")
OUTPUTS = ("top_item_ids", "top_scores")  # ONNX names must differ from the inputs' names
K_INPUT = "k"  # how many items to select: the batch's largest k (see _k_as_input)


PORTABLE = True  # onnxruntime picks the CUDA or the CPU provider at load


def save(run_dir: Path, spec: GraphSpec, out: Path, manifest: ExportManifest) -> dict:
    import torch

    from recserve.export.graph import build_graph, example_inputs

    precision = manifest.precision
    if precision not in ("fp32", "int8"):
        raise ExportError(f"onnx: precision {precision!r} is not offered; use fp32 or int8 (CPU)")
    graph = build_graph(run_dir, spec, manifest.max_k, "fp32")
    example = example_inputs(spec, batch=4, length=min(spec.window - 1, 9))
    batch, length = torch.export.Dim("batch", min=1, max=65536), torch.export.Dim("length", min=1, max=spec.window - 1)
    target = out / (FILE if precision == "fp32" else "model.fp32.onnx")
    torch.onnx.export(
        graph,
        example,
        target,
        input_names=list(INPUTS),
        output_names=list(OUTPUTS),
        dynamo=True,
        dynamic_shapes={"item_ids": {0: batch, 1: length}, "lengths": {0: batch}, "exclude_seen": {0: batch}},
        optimize=True,
        verbose=False,
    )
    if precision == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(target, out / FILE, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"])
        target.unlink()
    _k_as_input(out / FILE)
    for extra in out.glob("*.onnx.data"):
        log.debug("external weights in %s", extra)
    return {}


def _k_as_input(path: Path) -> None:
    """Makes the graph's top-k size an input (``k``, int64 [1]) instead of the constant ``max_k``.

    The graph computes only the k a batch asks for: selecting the top 10 of a catalogue costs a tenth of
    selecting the top 100, and at small batches that selection is a fifth of the whole graph.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)  # weights stay in their external file
    graph = model.graph
    topk = [node for node in graph.node if node.op_type == "TopK"]
    if len(topk) != 1:
        raise ExportError(f"onnx: expected one TopK node in the exported graph, found {len(topk)}")
    constant = topk[0].input[1]
    topk[0].input[1] = K_INPUT
    graph.input.append(onnx.helper.make_tensor_value_info(K_INPUT, onnx.TensorProto.INT64, [1]))
    if not any(constant in node.input for node in graph.node):
        for initializer in [i for i in graph.initializer if i.name == constant]:
            graph.initializer.remove(initializer)
    for output in graph.output:
        output.type.tensor_type.shape.dim[1].dim_param = K_INPUT
    del graph.value_info[:]  # shape hints from the export, some of them with the old constant width
    onnx.save(model, str(path))
    onnx.checker.check_model(str(path))


def load(out: Path, spec: GraphSpec, manifest: ExportManifest, device: str) -> Runner:
    import onnxruntime as ort

    providers = (
        ["CUDAExecutionProvider", "CPUExecutionProvider"] if device.startswith("cuda") else ["CPUExecutionProvider"]
    )
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)  # the server sets one per model instance
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # idle threads must not spin: they share the cores with the server and the other instances
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(out / FILE), options, providers=providers)
    top = min(manifest.max_k, len(spec.vocab_ids))  # the graph never selects more than the catalogue holds

    def run(ids: np.ndarray, lengths: np.ndarray, exclude: np.ndarray, k: int | None = None):
        feed = dict(zip(INPUTS, (ids, lengths, np.ascontiguousarray(exclude))))
        feed[K_INPUT] = np.array([top if k is None else min(k, top)], dtype=np.int64)
        top_ids, scores = session.run(list(OUTPUTS), feed)
        return top_ids, scores

    return run
