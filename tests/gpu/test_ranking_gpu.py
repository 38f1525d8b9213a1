"""The leave-one-out ranking on a GPU (run on a GPU machine; skipped elsewhere): its torch.compile'd count and
draws give every protocol's ranks exactly as the plain operations do; the kernels' tiled count counts the
scores it makes exactly, and ranks as the dense scores do.

It needs nothing of the serving stack: on a GPU machine without tritonclient, run it with
``python -m pytest --noconftest tests/gpu/test_ranking_gpu.py``.
"""

import logging

import numpy as np
import pytest
import torch

import recserve.train.leave_one_out as leave_one_out
import recserve.train.rank_kernels as rank_kernels
from recserve.bench.synthetic import zipf_sequences
from recserve.models import SASRec, SASRecConfig
from recserve.train.fused import GpuFused
from recserve.train.leave_one_out import PROTOCOLS, Ranker
from recserve.train.rank_kernels import PRECISIONS, TileScores

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _tied_model_and_ranker(items: int = 50_000, users: int = 3_000):
    """A SASRec with a bias that moves the ranks and items that tie in pairs, and a ranker of its users."""
    seq = zipf_sequences(users, items, 30)
    inputs, targets = seq.truncated(1), seq.last(1)
    torch.manual_seed(0)
    model = SASRec(SASRecConfig(num_items=items, window=50)).cuda().eval()
    with torch.no_grad():
        model.out_bias.normal_(0, 0.5)
        model.item_emb.weight[1:items:2] = model.item_emb.weight[2 : items + 1 : 2]
        model.out_bias[1:items:2] = model.out_bias[2 : items + 1 : 2]
    ranker = Ranker(inputs, targets, np.bincount(inputs.items, minlength=items + 2), 50, items + 1, "cuda", seed=2)
    return model, ranker


@pytest.mark.parametrize("hidden", [64, 72])  # a tile's product in one step of the hidden width, and in two
@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_kernels_count_the_scores_they_make(monkeypatch, precision, hidden):
    """1,000 users x 30,001 items (the tiles' edges cut), items tying in pairs: the count is that of the scores
    the count kernel met (written out for the test), the named items' scores (targets, any column) are those
    scores to the bit, the scores are float32's within 1e-5, and a NaN query flags its row alone."""
    monkeypatch.setattr(TileScores, "precision", precision)
    generator = torch.Generator("cuda").manual_seed(0)
    users, items, mask_index = 1_000, 30_001, 30_000
    query = torch.randn(users, hidden, device="cuda", generator=generator)
    table = torch.randn(items, hidden, device="cuda", generator=generator) * 0.2
    bias = torch.randn(items, device="cuda", generator=generator)
    table[1::2], bias[1::2] = table[2::2][: len(table[1::2])], bias[2::2][: len(bias[1::2])]
    target = torch.randint(1, mask_index, (users,), device="cuda", generator=generator)
    scores = TileScores(query, table, bias)
    written = torch.full((users, items), float("nan"), device="cuda")
    target_score, above, bad = scores.tally(target, mask_index, written)
    assert not torch.isnan(written).any() and not bad.any()
    columns = torch.arange(items, device="cuda")
    rankable = (columns != 0) & (columns != mask_index) & (columns != target[:, None])
    torch.testing.assert_close(above, ((written >= target_score) & rankable).sum(1), rtol=0, atol=0)
    assert torch.equal(target_score, written.gather(1, target[:, None]))
    named = torch.randint(0, items, (users, 40), device="cuda", generator=generator)
    assert torch.equal(scores.at(named), written.gather(1, named))
    exact = (query.double() @ table.double().T + bias.double()).float()
    torch.testing.assert_close(written, exact, rtol=1e-5, atol=1e-5)
    query[7, 3] = float("nan")
    _, _, bad = TileScores(query, table, bias).tally(target, mask_index)
    assert bad.nonzero().flatten().tolist() == [7]


def test_a_count_whose_pipeline_does_not_fit_runs_one_stage_deep_and_counts_alike(monkeypatch):
    """A pipeline of more tiles than the GPU's shared memory holds (as the default's two would on an A10G): the
    count runs its loads one tile at a time, with the same counts."""
    generator = torch.Generator("cuda").manual_seed(1)
    query = torch.randn(300, 64, device="cuda", generator=generator)
    table = torch.randn(20_000, 64, device="cuda", generator=generator) * 0.2
    bias = torch.randn(20_000, device="cuda", generator=generator)
    target = torch.randint(1, 19_999, (300,), device="cuda", generator=generator)
    monkeypatch.setattr(TileScores, "count_stages", None)
    expected = TileScores(query, table, bias).tally(target, 19_999)[1]
    monkeypatch.setattr(rank_kernels, "NUM_STAGES", 8)
    monkeypatch.setattr(TileScores, "count_stages", None)
    assert torch.equal(TileScores(query, table, bias).tally(target, 19_999)[1], expected)
    assert TileScores.count_stages == 1


def test_the_tiled_ranking_ranks_as_the_dense_scores_do(monkeypatch):
    """Every protocol's ranks from the kernels against the dense float32 scores (compiled count): the same for
    nearly every user, ties (the paired items) counted against the target alike; the batches are wider."""
    model, ranker = _tied_model_and_ranker()
    got = {}
    for tiled in (False, True):
        monkeypatch.setattr(TileScores, "enabled", tiled)
        assert leave_one_out.counts_tiled(model, torch.device("cuda")) == tiled
        with torch.no_grad():
            got[tiled] = ranker.ranks(model, PROTOCOLS)
    for name in PROTOCOLS:
        alike = np.mean(got[True][name] == got[False][name])
        apart = np.abs(got[True][name].astype(np.float64) - got[False][name]).max()
        print(f"{name}: {alike:.4%} of users ranked alike, at most {apart:g} apart")
        assert alike >= 0.99 and apart <= 3, name


def test_the_compiled_ranking_gives_the_plain_ranks_under_every_protocol(monkeypatch, caplog):
    """50,000 items, 3,000 users in batches of 700 (the last one shorter), a SASRec with a bias that moves
    the ranks and items that tie in pairs, in float32 and under bf16 autocast as validation runs it (the
    dense scores: the kernels' count off)."""
    monkeypatch.setattr(TileScores, "enabled", False)
    items = 50_000
    model, ranker = _tied_model_and_ranker(items)
    monkeypatch.setitem(leave_one_out.SCORES_PER_BATCH, "cuda", 700 * (items + 2))
    caplog.set_level(logging.WARNING)
    for bf16 in (False, True):
        got = {}
        for fused in (False, True):
            monkeypatch.setattr(GpuFused, "enabled", fused)
            with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=bf16):
                got[fused] = ranker.ranks(model, PROTOCOLS)
        for name in PROTOCOLS:
            np.testing.assert_array_equal(got[True][name], got[False][name], err_msg=f"{name}, bf16={bf16}")
    assert leave_one_out._tally.compiled is not None and leave_one_out._draws.compiled is not None
    assert "runs uncompiled" not in caplog.text, "a compiled function fell back to the plain one"
