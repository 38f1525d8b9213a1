"""The native graph of each transformer with its default settings, traced on a GPU as `recserve export
--device cuda` traces it (run on a GPU machine; skipped elsewhere), answers as the model does eagerly.

It needs nothing of the serving stack: on a GPU machine without tritonclient, run it with
``python -m pytest --noconftest tests/gpu/test_native_graph_gpu.py``.
"""

import pytest
import torch

from recserve.bench.synthetic import make_random_run
from recserve.export import native_export
from recserve.export.graph import build_graph, load_spec
from recserve.export.torchscript import trace_frozen
from recserve.models.serving_graph import NativeGraph

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("model", ["sasrec", "bert4rec"])
def test_default_models_trace_on_the_gpu_and_answer_as_eager(model, tmp_path):
    # SASRec's defaults include relative positions, whose bias lookup once took a host tensor into the trace
    run = make_random_run(tmp_path / "run", num_items=5_000, model=model, hidden=64, heads=2, window=20)
    spec = load_spec(run)
    graph = NativeGraph(build_graph(run, spec, 20, "fp32").cuda(), dynamic_k=False)
    length = spec.window - 1
    with torch.inference_mode():
        traced = trace_frozen(graph, tuple(t.cuda() for t in native_export.example(4, length, spec)))
        inputs = tuple(t.cuda() for t in native_export.example(3, length, spec, seed=7))
        got, expected = traced(*inputs), graph(*inputs)
    assert torch.equal(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])
