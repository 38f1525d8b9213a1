"""Ranking metrics against values written as formulas."""

import math

import numpy as np
import pytest

from recserve.train.metrics import hit_rate, mrr, ndcg, ranking_metrics


def test_hit_rate_counts_ranks_inside_k():
    assert hit_rate(np.array([0, 4, 9, 10]), 10) == 3 / 4


def test_ndcg_is_reciprocal_log_of_rank_inside_k():
    ranks = np.array([0, 1, 5, 9, 10, 30])  # rank 9 is the 10th place, rank 10 the 11th: outside
    expected = (1 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(7) + 1 / math.log2(11) + 0 + 0) / 6
    assert ndcg(ranks, 10) == pytest.approx(expected)


def test_an_unrankable_target_is_a_miss_under_every_metric():
    from recserve.train.leave_one_out import UNRANKABLE

    out = ranking_metrics(np.array([0, UNRANKABLE]))
    assert out["hr@20"] == out["ndcg@20"] == 0.5 and out["mrr"] == pytest.approx(0.5, abs=1e-15)


def test_mrr_is_mean_reciprocal_rank():
    assert mrr(np.array([0, 1, 3])) == pytest.approx((1 + 1 / 2 + 1 / 4) / 3)


def test_ranking_metrics_has_every_key():
    out = ranking_metrics(np.array([0, 2, 50]))
    assert set(out) == {"hr@1", "hr@5", "hr@10", "hr@20", "ndcg@5", "ndcg@10", "ndcg@20", "mrr"}
    assert out["hr@1"] == pytest.approx(1 / 3)
