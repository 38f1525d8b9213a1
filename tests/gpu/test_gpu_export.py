"""GPU-only export paths (run on a GPU machine; skipped elsewhere): each export's answers computed here
against the eager fp32 graph on the CPU, not the manifest's word for it."""

import numpy as np
import pytest
import torch

from recserve.export.backends import load_runner
from recserve.export.exporter import export_run
from recserve.export.graph import build_graph, example_inputs, load_spec
from recserve.export.runner import torch_runner
from recserve.export.validate import FP32_SCORE_TOL

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _answers(run, export_dir):
    """The export's answers on the GPU and eager fp32's on the CPU, for a batch no parity case used."""
    spec = load_spec(run)
    inputs = [t.numpy() for t in example_inputs(spec, 11, 19, seed=42)]
    reference = torch_runner(build_graph(run, spec, 100), "cpu", len(spec.vocab_ids))(*inputs)
    return load_runner(export_dir, device="cuda")(*inputs), reference


@pytest.mark.parametrize(("backend", "precision"), [("cudagraph", "fp32"), ("eager", "fp32"), ("torchscript", "fp32")])
def test_fp32_gpu_exports_match_eager(tiny_run, tmp_path, backend, precision):
    manifest = export_run(tiny_run, backend, precision, tmp_path / "out", device="cuda")
    assert manifest.validation["top10_overlap"] == 1.0
    got, reference = _answers(tiny_run, tmp_path / "out")
    np.testing.assert_array_equal(got[0][:, :10], reference[0][:, :10])
    np.testing.assert_allclose(got[1][:, :10], reference[1][:, :10], atol=FP32_SCORE_TOL)


@pytest.mark.parametrize(("backend", "precision"), [("cudagraph", "bf16"), ("eager", "fp16"), ("eager", "bf16")])
def test_reduced_precision_on_gpu_keeps_most_of_the_top10(tiny_run, ml100k_dir, tmp_path, backend, precision):
    manifest = export_run(tiny_run, backend, precision, tmp_path / "out", device="cuda", data_dir=ml100k_dir)
    assert manifest.validation["top10_overlap"] > 0.8
    got, reference = _answers(tiny_run, tmp_path / "out")
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got[0][:, :10], reference[0][:, :10])])
    changed = np.abs(got[1][:, :10] - reference[1][:, :10]).max()
    assert overlap > 0.8 and changed > 0  # reduced: close, and not the fp32 scores themselves


@pytest.mark.parametrize("backend", ["cudagraph", "eager"])
def test_new_written_rules_reach_the_device_copy_row_by_row(tmp_path, backend, device="cuda"):
    """Written rules one after another, past the rows the book keeps (rows taken again), and a hide between:
    the GPU runner's masks (the captured graphs' buffer, or the eager runner's copy) take only the changed rows,
    and every answer holds only what its rule lets through, as the CPU's eager answer does. A synthetic run
    (random weights, 2,000 items, a category each: the item ID modulo 20), so no data set is needed."""
    import itertools

    from recserve.bench.synthetic import make_random_run
    from recserve.constants import MAX_RULE_MASKS
    from recserve.rules.rule_book import RequestRules
    from recserve.serving.predictor import Predictor

    run = make_random_run(tmp_path / "run", num_items=2000, hidden=32, layers=1, heads=2, window=16)
    export_run(run, backend, "fp32", tmp_path / "here", device=device)
    export_run(run, "eager", "fp32", tmp_path / "cpu")
    here, cpu = Predictor.load(tmp_path / "here", device), Predictor.load(tmp_path / "cpu", "cpu")
    histories = [np.array([1, 2, 3]), np.array([50, 172, 181, 258, 300])]
    pairs = list(itertools.combinations(range(20), 2))[: MAX_RULE_MASKS + 12]
    for n, (a, b) in enumerate(pairs):
        where = f'category in ("c{a:02d}", "c{b:02d}")'
        if n == 40:
            hidden = np.zeros(2000, dtype=bool)
            hidden[:200] = True
            here.rules.hide(hidden)
            cpu.rules.hide(hidden)
        rules = [RequestRules(where=where)] * len(histories)
        here.rules.check(rules[0])
        cpu.rules.check(rules[0])
        got = here.answer(histories, 10, True, rules).for_triton()
        want = cpu.answer(histories, 10, True, rules).for_triton()
        for row in range(len(histories)):
            ids = got.rows(row, row + 1, 10)[0][0].tolist()
            assert all(i % 20 in (a, b) for i in ids) and (n < 40 or min(ids) > 200), (n, ids)
            wanted = want.rows(row, row + 1, 10)[0][0].tolist()
            assert len(ids) == len(wanted) == 10 and len(set(ids) & set(wanted)) >= 9, (n, ids, wanted)


def test_a_gpu_export_captures_its_native_model_and_refuses_one_that_reads_the_host(tmp_path):
    """A GPU's TorchScript export is captured as CUDA graphs before it is written, each method at batch 1 and 4,
    as recserve's backend captures it when it loads it; a native graph that reads a value back to the host
    mid-call (the CPU's form, which reads the batch's largest k) is refused with what the backend would meet.
    30,000 items: past the 100 chunks where a GPU's graph takes its top k through chunks."""
    from recserve.bench.synthetic import make_random_run
    from recserve.errors import ExportError
    from recserve.export import native_export
    from recserve.export.torchscript import trace_frozen
    from recserve.models.serving_graph import NativeGraph

    run = make_random_run(tmp_path / "run", num_items=30_000, hidden=32, layers=1, heads=2, window=12)
    manifest = export_run(run, "torchscript", "bf16", tmp_path / "out", device="cuda")
    assert manifest.validation["native_captured"] == ["forward@1", "ruled@1", "forward@4", "ruled@4"]

    spec = load_spec(run)
    host_k = NativeGraph(build_graph(run, spec, 100).cuda(), dynamic_k=True)
    inputs = tuple(t.cuda() for t in native_export.example(4, spec.window - 1, spec))
    with torch.inference_mode():
        torch.jit.save(trace_frozen(host_k, inputs), tmp_path / "host_k.pt")
    with pytest.raises(ExportError, match="forward cannot be captured as a CUDA graph at batch 1"):
        native_export.check_capture(tmp_path, "host_k.pt", spec, "cuda", ruled=False)
