"""GPU-only export paths (run on a GPU machine; skipped elsewhere)."""

import pytest
import torch

from recserve.export.exporter import export_run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize(("backend", "precision"), [("cudagraph", "fp32"), ("eager", "fp32"), ("torchscript", "fp32")])
def test_fp32_gpu_exports_match_eager(tiny_run, tmp_path, backend, precision):
    manifest = export_run(tiny_run, backend, precision, tmp_path / "out", device="cuda")
    assert manifest.validation["top10_overlap"] == 1.0


@pytest.mark.parametrize(("backend", "precision"), [("cudagraph", "bf16"), ("eager", "fp16"), ("eager", "bf16")])
def test_reduced_precision_on_gpu_keeps_most_of_the_top10(tiny_run, ml100k_dir, tmp_path, backend, precision):
    manifest = export_run(tiny_run, backend, precision, tmp_path / "out", device="cuda", data_dir=ml100k_dir)
    assert manifest.validation["top10_overlap"] > 0.8
