"""Ranking metrics against values written as formulas."""

import math

import numpy as np
import pytest

from recserve.train.metrics import hit_rate, mrr, ndcg, ranking_metrics


def test_hit_rate_counts_ranks_inside_k():
    assert hit_rate(np.array([0, 4, 9, 10]), 10) == 3 / 4


def test_ndcg_is_reciprocal_log_of_rank_inside_k():
    ranks = np.array([0, 1, 5, 30])
    expected = (1 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(7) + 0) / 4
    assert ndcg(ranks, 10) == pytest.approx(expected)


def test_mrr_is_mean_reciprocal_rank():
    assert mrr(np.array([0, 1, 3])) == pytest.approx((1 + 1 / 2 + 1 / 4) / 3)


def test_ranking_metrics_has_every_key():
    out = ranking_metrics(np.array([0, 2, 50]))
    assert set(out) == {"hr@1", "hr@5", "hr@10", "hr@20", "ndcg@5", "ndcg@10", "ndcg@20", "mrr"}
    assert out["hr@1"] == pytest.approx(1 / 3)
