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
