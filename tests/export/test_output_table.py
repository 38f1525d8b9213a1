"""The 8-bit output layer (precision fp8): the item table in float8 e4m3 with a scale an item, scored by
``torch._scaled_mm``, and the exports that serve it."""

import numpy as np
import pytest
import torch

from recserve.errors import ConfigError, ExportError
from recserve.export import exporter
from recserve.export.backends import load_runner
from recserve.export.graph import build_graph, example_inputs, load_spec
from recserve.export.runner import torch_runner
from recserve.models.bert4rec import Bert4Rec
from recserve.models.model_configs import Bert4RecConfig
from recserve.models.output_table import FP8, dequantized, quantize_rows, scaled_product


def test_rows_read_back_within_e4m3s_rounding_and_pad_with_zeros():
    generator = torch.Generator().manual_seed(0)
    table = torch.randn(100, 32, generator=generator) * torch.logspace(-3, 2, 100)[:, None]  # rows of every size
    table[7] = 0
    rows, scale = quantize_rows(table, 16)
    assert rows.dtype == FP8 and rows.shape == (112, 32) and scale.shape == (112, 1)
    back = dequantized(rows, scale)
    largest = table.abs().amax(1, keepdim=True)
    # three mantissa bits: within a sixteenth of a value, or of e4m3's smallest step at the row's scale
    assert ((back[:100] - table).abs() <= table.abs() / 16 + largest * 2**-9 / 448 + 1e-30).all()
    torch.testing.assert_close(back[:100].abs().amax(1, keepdim=True), largest)  # each row's largest is kept
    assert (back[7] == 0).all() and (back[100:] == 0).all()


def test_the_scaled_product_is_the_product_of_what_both_sides_stand_for():
    generator = torch.Generator().manual_seed(1)
    table, query = torch.randn(50, 32, generator=generator), torch.randn(5, 32, generator=generator).bfloat16()
    rows, scale = quantize_rows(table, 16)
    got = scaled_product(query, rows, scale.T.contiguous())
    query_rows, query_scale = quantize_rows(query)
    expected = dequantized(query_rows, query_scale) @ dequantized(rows, scale).T
    assert got.shape == (5, 64) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=1e-2)  # the answer's bf16 rounding
    assert 0.01 < (got[:, :50].float() - query.float() @ table.T).abs().max() < 1.0  # and 8 bits are not 16


def test_a_hidden_width_off_sixteen_is_refused_when_quantized():
    model = Bert4Rec(Bert4RecConfig(num_items=30, window=8, hidden=24, layers=1, heads=2))
    with pytest.raises(ConfigError, match="hidden width in multiples of 16, not 24"):
        model.quantize_output()


def test_a_mult_vae_is_refused_an_8_bit_output_layer(vae_run, tmp_path):
    with pytest.raises(ExportError, match="quantizes a transformer's output layer; for Mult-VAE use bf16"):
        exporter.export_run(vae_run, "eager", "fp8", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("run", ["tiny_run", "sasrec_run"])
def test_the_native_graph_scores_against_the_8_bit_table(run, request, tmp_path):
    """The TorchScript file that recserve's backend loads reads the float8 table (kept as an attribute: PyTorch
    cannot save it as a frozen constant) in both its methods, and answers as the eager graph at fp8 does."""
    run = request.getfixturevalue(run)
    manifest = exporter.export_run(run, "torchscript", "fp8", tmp_path / "ts")
    assert manifest.precision == "fp8" and manifest.validation["native_ruled"]["top10_overlap"] > 0.8
    native = torch.jit.load(tmp_path / "ts" / "native.pt")
    assert "aten::_scaled_mm" in str(native.forward.inlined_graph)
    assert "aten::_scaled_mm" in str(native.ruled.inlined_graph)
    assert native.fused.head.encoder.output_rows.dtype == FP8
    spec = load_spec(run)
    inputs = [t.numpy() for t in example_inputs(spec, 9, 19, seed=5)]
    eager = torch_runner(build_graph(run, spec, 100, "fp8"), "cpu", len(spec.vocab_ids))(*inputs)
    got = load_runner(tmp_path / "ts")(*inputs)
    np.testing.assert_allclose(got[1][:, :10], eager[1][:, :10], rtol=1e-5, atol=1e-5)
    plain = torch_runner(build_graph(run, spec, 100, "bf16"), "cpu", len(spec.vocab_ids))(*inputs)
    assert np.abs(got[1][:, :10] - plain[1][:, :10]).max() > 1e-4  # not the bf16 table's scores
