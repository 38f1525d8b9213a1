"""``onnx``: dynamic batch and length axes, int64 inputs, run with onnxruntime; int8 by its dynamic quantization.

ONNX has no search operator, so sparse integer IDs and string IDs are mapped by the predictor. Loading needs
numpy and onnxruntime only (no torch): what a Triton image serving the fused layout over ONNX installs.
"""

from __future__ import annotations

import logging
import os
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from recserve.artifacts.export_manifest import ExportManifest
from recserve.constants import (
    INPUT_EXCLUDE_SEEN,
    INPUT_ITEM_IDS,
    INPUT_K,
    NATIVE_ONNX_FILE,
    NATIVE_ONNX_OUTPUT_IDS,
    OUTPUT_SCORES,
    OUTPUT_UNKNOWN_IDS,
)
from recserve.errors import ExportError
from recserve.export.backend_protocol import Runner, rule_inputs
from recserve.export.spec import GraphSpec

log = logging.getLogger(__name__)

FILE = "model.onnx"
INPUTS = ("item_ids", "lengths", "exclude_seen", "masks", "mask_of_row", "excluded", "included")
OUTPUTS = ("top_item_ids", "top_scores")  # ONNX names must differ from the inputs' names
K_INPUT = "k"  # how many items to select: the batch's largest k (see _k_as_input)
# the native graph's (recserve.models.serving_graph.NativeGraph): the recommender contract's names, but for the IDs
# out, which an ONNX graph cannot name like an input
NATIVE_INPUTS = (INPUT_ITEM_IDS, INPUT_K, INPUT_EXCLUDE_SEEN)
NATIVE_OUTPUTS = (NATIVE_ONNX_OUTPUT_IDS, OUTPUT_SCORES, OUTPUT_UNKNOWN_IDS)


PORTABLE = True  # onnxruntime picks the CUDA or the CPU provider at load


def save(run_dir: Path, spec: GraphSpec, out: Path, manifest: ExportManifest) -> dict:
    import torch

    from recserve.export import native_export
    from recserve.export.graph import build_graph, example_inputs, rule_shapes
    from recserve.models.serving_graph import NativeGraph

    precision = manifest.precision
    if precision not in ("fp32", "int8"):
        raise ExportError(f"onnx: precision {precision!r} is not offered; use fp32 or int8 (CPU)")
    graph = build_graph(run_dir, spec, manifest.max_k, "fp32", manifest.explore_new)
    example = example_inputs(spec, batch=4, length=min(spec.window - 1, 9))
    batch, length = torch.export.Dim("batch", min=1, max=65536), torch.export.Dim("length", min=1, max=spec.window - 1)
    shapes = {"item_ids": {0: batch, 1: length}, "lengths": {0: batch}, "exclude_seen": {0: batch}}
    shapes |= rule_shapes(batch)
    _export(graph, example, out / FILE, INPUTS, OUTPUTS, shapes, precision)
    # exploration lays its columns out over the whole answer (serving_graph.explored_top): it stays max_k wide
    explores = bool(manifest.explore_new)
    (_max_k_wide if explores else _k_as_input)(out / FILE)
    added = {}
    reason = native_export.unsupported(spec)
    if reason is None:
        inputs = native_export.example(4, spec.window - 1, spec)
        shapes = {name: {0: batch} for name in NATIVE_INPUTS}
        target = out / NATIVE_ONNX_FILE
        _export(NativeGraph(graph, dynamic_k=False), inputs, target, NATIVE_INPUTS, NATIVE_OUTPUTS, shapes, precision)
        if explores:
            _answer_to_batch_k(target, min(manifest.max_k, len(spec.vocab_ids)))
        else:
            _k_from_batch(target)
        added["native_model"] = NATIVE_ONNX_FILE
    else:
        log.info("no native model: %s", reason)
        added["native_absent"] = reason
    for extra in out.glob("*.onnx.data"):
        log.debug("external weights in %s", extra)
    return added


@contextmanager
def quiet_exporter():
    """torch.onnx's notes that say nothing of this graph kept out of the user's terminal: a line for each
    torchvision operator it does not register (eight), the axis names it merges, the tracer's FutureWarnings.
    Its errors still raise."""
    names = ("torch.onnx._internal.exporter._registration", "torch.onnx._internal.exporter._core", "onnxscript")
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*will not be used, since it shares the same shape constraints.*")
        warnings.filterwarnings("ignore", category=FutureWarning)
        try:
            for logger in loggers:
                logger.setLevel(logging.ERROR)
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


def _export(module, example, target: Path, inputs, outputs, dynamic_shapes: dict, precision: str) -> None:
    """torch.onnx (dynamo) into ``target``; int8: onnxruntime's dynamic quantization of its matrix products."""
    import torch

    fp32 = target if precision == "fp32" else target.with_suffix(".fp32.onnx")
    with quiet_exporter():
        torch.onnx.export(
            module,
            example,
            fp32,
            input_names=list(inputs),
            output_names=list(outputs),
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            optimize=True,
            verbose=False,
        )
    if precision == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(fp32, target, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"])
        fp32.unlink()
        for data in fp32.parent.glob(fp32.name + ".data"):
            data.unlink()


def _top_k_node(graph):
    topk = [node for node in graph.node if node.op_type == "TopK"]
    if len(topk) != 1:
        raise ExportError(f"onnx: expected one TopK node in the exported graph, found {len(topk)}")
    return topk[0]


def _retarget_top_k(path: Path, width: str, new_nodes: list, new_inputs: list) -> None:
    """Makes the graph's one TopK select ``width`` items (a tensor name) instead of its constant; ``new_nodes``
    compute ``width`` from the graph's inputs and ``new_inputs`` are added to them."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)  # weights stay in their external file
    graph = model.graph
    topk = _top_k_node(graph)
    constant = topk.input[1]
    topk.input[1] = width
    graph.input.extend(new_inputs)
    if not any(constant in node.input for node in graph.node):
        for initializer in [i for i in graph.initializer if i.name == constant]:
            graph.initializer.remove(initializer)
    _width_unfixed(graph)
    nodes = list(new_nodes) + list(graph.node)  # topological order: what computes the width comes first
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, str(path))
    onnx.checker.check_model(str(path))


def _width_unfixed(graph) -> None:
    """The outputs' width a named dimension rather than the export's constant (a Triton config declares it -1),
    and the export's shape hints dropped (some of them hold that constant)."""
    for output in graph.output:
        if len(output.type.tensor_type.shape.dim) > 1:
            output.type.tensor_type.shape.dim[1].dim_param = K_INPUT
    del graph.value_info[:]


def _max_k_wide(path: Path) -> None:
    """An answer that stays ``max_k`` wide (exploration's columns are laid out over all of it), declared of any
    width as every other export's is."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    _width_unfixed(model.graph)
    onnx.save(model, str(path))
    onnx.checker.check_model(str(path))


def _k_as_input(path: Path) -> None:
    """Makes the graph's top-k size an input (``k``, int64 [1]) instead of the constant ``max_k``.

    The graph computes only the k a batch asks for: selecting the top 10 of a catalogue costs a tenth of
    selecting the top 100, and at small batches that selection is a fifth of the whole graph.
    """
    import onnx

    _retarget_top_k(path, K_INPUT, [], [onnx.helper.make_tensor_value_info(K_INPUT, onnx.TensorProto.INT64, [1])])


def _batch_width_nodes(max_k: int) -> list:
    """Nodes that compute ``native_width`` (int64 [1]): the largest k of the native graph's batch, clipped to
    1..max_k."""
    from onnx import TensorProto, helper

    const = lambda name, dims, value: helper.make_node(  # noqa: E731
        "Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, dims, [value])
    )
    return [
        helper.make_node("Cast", [K_INPUT], ["native_k64"], to=TensorProto.INT64),
        helper.make_node("ReduceMax", ["native_k64"], ["native_kmax"], keepdims=0),
        const("native_one", [], 1),
        const("native_max_k", [], max_k),
        helper.make_node("Max", ["native_kmax", "native_one"], ["native_k_low"]),
        helper.make_node("Min", ["native_k_low", "native_max_k"], ["native_k_clipped"]),
        const("native_shape", [1], 1),
        helper.make_node("Reshape", ["native_k_clipped", "native_shape"], ["native_width"]),
    ]


def _k_from_batch(path: Path) -> None:
    """The native graph selects the largest k of its batch, clipped to 1..max_k, instead of ``max_k``."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    max_k = int(onnx.numpy_helper.to_array(_constant(model.graph, _top_k_node(model.graph).input[1])).reshape(-1)[0])
    _retarget_top_k(path, "native_width", _batch_width_nodes(max_k), [])


def _answer_to_batch_k(path: Path, max_k: int) -> None:
    """The native graph's answer (selected ``max_k`` wide: exploration's columns are laid out over all of it)
    cut to the largest k of its batch, as ``_k_from_batch``'s is: a width Triton's config declares -1."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    nodes = _batch_width_nodes(max_k) + [
        helper.make_node("Constant", [], ["native_zero"], value=helper.make_tensor("z", TensorProto.INT64, [1], [0])),
        helper.make_node("Constant", [], ["native_axis"], value=helper.make_tensor("a", TensorProto.INT64, [1], [1])),
    ]
    for output in graph.output:
        if output.name not in NATIVE_OUTPUTS[:2]:  # the IDs and scores; the unknown IDs' count is one wide
            continue
        whole = f"{output.name}_max_k"
        for node in graph.node:
            node.output[:] = [whole if name == output.name else name for name in node.output]
            node.input[:] = [whole if name == output.name else name for name in node.input]
        nodes.append(helper.make_node("Slice", [whole, "native_zero", "native_width", "native_axis"], [output.name]))
    graph.node.extend(nodes)
    _width_unfixed(graph)
    onnx.save(model, str(path))
    onnx.checker.check_model(str(path))


def _constant(graph, name: str):
    for initializer in graph.initializer:
        if initializer.name == name:
            return initializer
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            return node.attribute[0].t
    raise ExportError(f"onnx: the TopK size {name} is not a constant")


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
    takes_k = K_INPUT in {i.name for i in session.get_inputs()}  # not where the answer explores: max_k wide

    def run(
        ids: np.ndarray,
        lengths: np.ndarray,
        exclude: np.ndarray,
        *rules: np.ndarray,
        k: int | None = None,
    ):
        filled = rule_inputs(len(spec.vocab_ids), len(ids), *rules)
        feed = dict(zip(INPUTS, (np.ascontiguousarray(a) for a in (ids, lengths, exclude, *filled))))
        if takes_k:
            feed[K_INPUT] = np.array([top if k is None else min(k, top)], dtype=np.int64)
        top_ids, scores = session.run(list(OUTPUTS), feed)
        return (top_ids, scores) if takes_k or k is None else (top_ids[:, :k], scores[:, :k])

    return run
