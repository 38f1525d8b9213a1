"""The leave-one-out ranking on a GPU (run on a GPU machine; skipped elsewhere): its torch.compile'd count and
draws give every protocol's ranks exactly as the plain operations do.

It needs nothing of the serving stack: on a GPU machine without tritonclient, run it with
``python -m pytest --noconftest tests/gpu/test_ranking_gpu.py``.
"""

import logging

import numpy as np
import pytest
import torch

import recserve.train.leave_one_out as leave_one_out
from recserve.bench.synthetic import zipf_sequences
from recserve.models import SASRec, SASRecConfig
from recserve.train.fused import GpuFused
from recserve.train.leave_one_out import PROTOCOLS, Ranker

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_the_compiled_ranking_gives_the_plain_ranks_under_every_protocol(monkeypatch, caplog):
    """50,000 items, 3,000 users in batches of 700 (the last one shorter), a SASRec with a bias that moves
    the ranks and items that tie in pairs, in float32 and under bf16 autocast as validation runs it."""
    items, users = 50_000, 3_000
    seq = zipf_sequences(users, items, 30)
    inputs, targets = seq.truncated(1), seq.last(1)
    torch.manual_seed(0)
    model = SASRec(SASRecConfig(num_items=items, window=50)).cuda().eval()
    with torch.no_grad():
        model.out_bias.normal_(0, 0.5)
        model.item_emb.weight[1:items:2] = model.item_emb.weight[2 : items + 1 : 2]
        model.out_bias[1:items:2] = model.out_bias[2 : items + 1 : 2]
    ranker = Ranker(inputs, targets, np.bincount(inputs.items, minlength=items + 2), 50, items + 1, "cuda", seed=2)
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
