"""The served graph's top k through chunks of the catalogue (``chunked_top_k``, a GPU's native graph): the scores
``torch.topk`` gives, whatever the rows hold."""

import numpy as np
import pytest
import torch

from recserve.bench.synthetic import make_random_run
from recserve.constants import NATIVE_PAD_ID
from recserve.export.graph import build_graph, example_inputs, load_spec
from recserve.export.native_export import _capture_failure, example
from recserve.models.serving_graph import NativeGraph, chunked_top_k


def _assert_a_top_k(scores: torch.Tensor, top: torch.Tensor, index: torch.Tensor, k: int) -> None:
    """``top`` and ``index`` are a top k of ``scores``: ``topk``'s scores, each at its index, no index twice."""
    expected = scores.topk(k, 1).values
    assert torch.equal(top, expected)
    assert torch.equal(scores.gather(1, index), top)
    assert all(len(set(row.tolist())) == k for row in index)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunks_give_the_top_k_of_any_rows(dtype):
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 10_037, generator=generator).to(dtype)  # a last chunk cut short: 37 columns
    scores[1] = float("-inf")
    scores[1, torch.randperm(10_037, generator=generator)[:30]] = 1.0  # fewer allowed items than k
    scores[2] = float("-inf")  # none allowed
    scores[3] = scores[3].round()  # ties everywhere
    scores[4, -5:] = 50.0  # the best items past the last whole chunk
    scores[5, :150] = torch.linspace(10, 11, 150)  # the best items crowded into the first chunks
    for chunk, k in ((64, 100), (100, 100), (128, 10), (1000, 10)):
        top, index = chunked_top_k(scores, k, torch.arange(chunk), scores.shape[1], chunk)
        _assert_a_top_k(scores, top, index, k)


def _ints_from_tensor_constants(graph: torch.Graph) -> list[str]:
    """The Python ints a frozen graph computes from its tensor constants. A GPU's graph keeps such a constant on
    the device, so each of these ints is a read back to the host, which a CUDA graph's capture refuses (recserve's
    backend then fails to load the model)."""
    found = []
    for node in graph.findAllNodes("aten::Int"):
        pending, seen = [node.inputsAt(0).node()], set()
        while pending:
            source = pending.pop()
            if source in seen:
                continue
            seen.add(source)
            if source.kind() == "prim::Constant" and source.output().type().kind() == "TensorType":
                found.append(str(node).strip())
                break
            if source.kind() != "aten::size":  # a shape read of a tensor is the host's own
                pending.extend(value.node() for value in source.inputs())
    return found


def test_a_gpus_native_graph_answers_alike_through_chunks(tmp_path):
    """The native graph as a GPU export builds it (max_k wide, chunks of 256 items), traced, against the same
    graph selecting over whole rows: the same scores, plain and under business rules."""
    run = make_random_run(tmp_path / "run", num_items=30_000, hidden=32, layers=1, heads=2, window=12)
    spec = load_spec(run)
    graph = build_graph(run, spec, 100)
    chunked, whole = NativeGraph(graph, dynamic_k=False, chunk=256), NativeGraph(graph, dynamic_k=False)
    assert chunked.chunk_columns is not None and whole.chunk_columns is None

    def example_at(batch: int) -> tuple[tuple, tuple]:
        return example(batch, spec.window - 1, spec, seed=batch), example_inputs(spec, batch, 1)[3:]

    inputs, rules = example_at(9)
    traced = torch.jit.trace_module(chunked.eval(), {"forward": inputs, "ruled": inputs + rules}, check_trace=False)
    frozen = torch.jit.freeze(traced.eval(), preserved_attrs=["ruled"])  # as the export saves it
    assert _ints_from_tensor_constants(frozen.forward.graph) == _ints_from_tensor_constants(frozen.ruled.graph) == []
    with torch.inference_mode():
        for batch in (9, 4, 1):  # the traced batch and others: one graph serves every batch size
            inputs, rules = example_at(batch)
            for got, expected in (
                (traced(*inputs), whole(*inputs)),
                (traced.ruled(*inputs, *rules), whole.ruled(*inputs, *rules)),
            ):
                np.testing.assert_array_equal(got[1].numpy(), expected[1].numpy())
                tied = (expected[1][:, :, None] == expected[1][:, None, :]).sum(2) > 1
                assert torch.equal(torch.where(tied, 0, got[0]), torch.where(tied, 0, expected[0]))
                assert torch.equal(got[2], expected[2])


def test_a_refused_capture_names_the_cuda_error_and_the_graphs_line():
    """A GPU export captures its native model before it is written (``native_export.check_capture``, run by the
    GPU tests); where the capture fails, the refusal says in one line what CUDA said and which line of the
    frozen graph met it, from the TorchScript interpreter's traceback (the one the capture defect gave)."""
    failure = RuntimeError(
        "The following operation failed in the TorchScript interpreter.\n"
        "Traceback of TorchScript, serialized code (most recent call last):\n"
        '  File "code/__torch__/recserve/models/serving_graph.py", line 33, in forward\n'
        "    whole = torch.mul(_31, CONSTANTS.c19)\n"
        "    _32 = int(whole)\n"
        "          ~~~ <--- HERE\n"
        "RuntimeError: CUDA error: operation not permitted when stream is capturing\n"
        "CUDA kernel errors might be asynchronously reported at some other API call\n"
    )
    assert (
        _capture_failure(failure)
        == "CUDA error: operation not permitted when stream is capturing (at `_32 = int(whole)`)"
    )
    assert _capture_failure(RuntimeError("CUDA error: out of memory")) == "CUDA error: out of memory"
    assert _capture_failure(RuntimeError()) == "RuntimeError"


def test_a_gpus_native_graph_lays_rows_in_whole_chunks_and_answers_only_items(tmp_path):
    """A GPU's graph lays each row of scores over whole chunks, and its item table as many rows (shapes the
    matrix kernels align to), the columns past the catalogue at -inf. A rule that lets through fewer than k
    items, all in the last chunk, puts those columns among the top k's candidates: the answer holds the allowed
    items, then padding, and never an index past the catalogue (it would fail the IDs' lookup)."""
    run = make_random_run(tmp_path / "run", num_items=26_000, hidden=16, layers=1, heads=1, window=8)
    spec = load_spec(run)
    fused = build_graph(run, spec, 100)
    graph = NativeGraph(fused, dynamic_k=False, chunk=256)
    vocab = 26_002
    assert graph.width == 26_112  # 102 chunks, the last 110 columns past the catalogue
    # the item table as wide, so that the product spans whole rows; in the native graph's own copy
    assert graph.fused.head.encoder.item_emb.weight.shape == (26_112, 16)
    assert fused.head.encoder.item_emb.weight.shape == (vocab, 16)
    item_ids, k, _ = example(3, spec.window - 1, spec, seed=0)
    masks = torch.zeros((1, vocab), dtype=torch.bool)
    allowed = torch.arange(vocab - 8, vocab - 1)  # seven items, the catalogue's last
    masks[0, allowed] = True
    none = torch.zeros((3, 1), dtype=torch.int64)
    with torch.inference_mode():
        ids, top, _ = graph.ruled(item_ids, k, torch.zeros((3, 1), dtype=torch.bool), masks, none[:, 0], none, none)
    expected = graph.fused.index_to_id[allowed]
    assert torch.equal(ids[:, :7].sort(1).values, expected.expand(3, -1)) and bool((top[:, :7] > -1e30).all())
    assert bool((ids[:, 7:] == NATIVE_PAD_ID).all()) and bool((top[:, 7:] == float("-inf")).all())
    # which -inf columns fill a row is the top k's choice among ties (a GPU's radix select may take those past
    # the catalogue): the selection keeps every index in range, whatever the columns past it hold
    scores = torch.full((2, graph.width), float("-inf"))
    scores[:, vocab:] = 1.0
    _, index = graph._top(scores, k[:2])
    assert int(index.max()) == vocab - 1


def test_chunks_are_left_out_where_they_cannot_serve(tiny_run):
    """A catalogue of fewer than max_k chunks and a graph that reads k on the host keep ``topk`` over the row
    (as does one that explores: its answer's columns are laid out by ``explored_top``)."""
    graph = build_graph(tiny_run, load_spec(tiny_run), 100)
    assert NativeGraph(graph, dynamic_k=False, chunk=256).chunk_columns is None  # 1,684 items: 6 chunks
    assert NativeGraph(graph, dynamic_k=False, chunk=16).chunk_columns is not None
    assert NativeGraph(graph, dynamic_k=True, chunk=16).chunk_columns is None


def test_the_chunks_columns_are_made_where_the_graph_is(tiny_run):
    """A GPU export moves the graph to its device and then wraps it: the columns must be made there too (a CPU
    tensor beside CUDA scores fails the trace)."""
    graph = build_graph(tiny_run, load_spec(tiny_run), 100).to("meta")
    columns = NativeGraph(graph, dynamic_k=False, chunk=16).chunk_columns
    assert columns is not None and columns.device.type == "meta"
