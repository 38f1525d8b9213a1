"""The Mult-VAE protocol: the held-out split, Recall and NDCG as formulas, and a trained Mult-VAE beating popularity."""

import json
import math

import numpy as np
import pytest
import torch

from recserve.constants import METRICS_FILE
from recserve.data.sequences import Sequences
from recserve.errors import DataError
from recserve.train.heldout import evaluate_fold, heldout_metrics, split_heldout


def sequences(rows: list[list[int]]) -> Sequences:
    lengths = [len(r) for r in rows]
    return Sequences(
        np.array([i for r in rows for i in r], dtype=np.int64),
        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
    )


def user_sets(seq: Sequences) -> list[set]:
    return [set(seq.items[a:b].tolist()) for a, b in zip(seq.offsets[:-1], seq.offsets[1:])]


def test_split_holds_out_disjoint_users_and_splits_their_items_80_20():
    rng = np.random.default_rng(1)
    rows = [list(rng.choice(np.arange(1, 40), size=rng.integers(5, 15), replace=False)) for _ in range(50)]
    split = split_heldout(sequences(rows), heldout_share=0.1, seed=3)
    assert split.train.num_users == 40 and split.valid.fed.num_users == 5 and split.test.fed.num_users == 5
    all_users = [frozenset(r) for r in rows]
    train_users = [frozenset(s) for s in user_sets(split.train)]
    assert set(train_users) <= set(all_users)
    train_items = set(split.train.items.tolist())
    held_out = []
    for fold in (split.valid, split.test):
        for fed, targets in zip(user_sets(fold.fed), user_sets(fold.targets)):
            assert not fed & targets
            whole = fed | targets
            # one user's row, less only the items no training user has
            (original,) = [r for r in all_users if whole <= r and not (r - whole) & train_items]
            held_out.append(original)
            assert len(targets) == int(len(whole) * 0.2)
    assert len(set(held_out)) == 10 and not set(held_out) & set(train_users)  # ten users, none trained on


def test_split_drops_heldout_items_no_training_user_has():
    rows = [[1, 2, 3, 4, 5]] * 8 + [[1, 2, 3, 4, 99]] * 2
    split = split_heldout(sequences(rows), heldout_share=0.1, seed=0)
    for fold in (split.valid, split.test):
        assert 99 not in fold.fed.items and 99 not in fold.targets.items


def test_split_with_too_few_users_is_refused():
    with pytest.raises(DataError, match="too few"):
        split_heldout(sequences([[1, 2, 3, 4, 5]] * 2), heldout_share=0.1)


def test_recall_and_ndcg_follow_their_formulas():
    hits = torch.zeros(2, 100)
    hits[0, [0, 25]] = 1  # user 0: 3 targets, hits at ranks 0 and 25
    hits[1, [60]] = 1  # user 1: 1 target, hit at rank 60
    got = heldout_metrics(hits, torch.tensor([3, 1]))
    d = lambda r: 1 / math.log2(r + 2)  # noqa: E731
    assert got["recall@20"] == pytest.approx((1 / 3 + 0) / 2)
    assert got["recall@50"] == pytest.approx((2 / 3 + 0) / 2)
    ndcg0 = (d(0) + d(25)) / (d(0) + d(1) + d(2))
    ndcg1 = d(60) / d(0)
    assert got["ndcg@100"] == pytest.approx((ndcg0 + ndcg1) / 2)


def test_users_without_targets_are_not_counted():
    hits = torch.zeros(2, 100)
    hits[0, 0] = 1
    assert heldout_metrics(hits, torch.tensor([1, 0]))["recall@20"] == 1.0


def test_shares_of_a_fold_weighted_by_their_users_give_the_whole_folds_metrics():
    rng = np.random.default_rng(2)
    rows = [list(rng.choice(np.arange(1, 60), size=rng.integers(5, 20), replace=False)) for _ in range(80)]
    fold = split_heldout(sequences(rows), heldout_share=0.4, seed=0).valid
    scores = torch.randn(61, generator=torch.Generator().manual_seed(0))  # a fixed item order for every user
    score_fn = lambda tokens: scores.expand(len(tokens), -1)  # noqa: E731
    whole = evaluate_fold(score_fn, fold, 61)
    count = fold.fed.num_users
    shares = [evaluate_fold(score_fn, fold.share(a, b), 61) for a, b in ((0, 0), (0, 13), (13, count))]
    assert [s["users"] for s in shares] == [0, 13, count - 13] and whole["users"] == count
    for key in ("ndcg@100", "recall@20", "recall@50"):
        combined = sum(s[key] * s["users"] for s in shares[1:]) / count
        assert combined == pytest.approx(whole[key], abs=1e-12)
    assert shares[1]["ndcg@100"] != pytest.approx(shares[2]["ndcg@100"])  # the shares hold different users


def test_held_out_targets_rank_behind_every_item_they_tie_with():
    """Items 1..200. User 0: fed 1..10, targets 11..20; user 1: fed 191..200, targets 181..190 (so the targets
    sit below their tied items' indices for one user and above them for the other, and no tie order of top-k
    can favour both). A constant scorer puts the 180 other items before the targets, so nothing is found in the
    top 100; one that ties each user's targets with 15 other items above the rest finds them after those
    (ranks 15..24: half in the top 20)."""
    from recserve.train.heldout import FoldIn

    fold = FoldIn(
        fed=sequences([list(range(1, 11)), list(range(191, 201))]),
        targets=sequences([list(range(11, 21)), list(range(181, 191))]),
    )
    flat = evaluate_fold(lambda tokens: torch.zeros(len(tokens), 202), fold, 202)
    assert flat["recall@20"] == flat["recall@50"] == flat["ndcg@100"] == 0.0
    tied = torch.zeros(2, 202)
    tied[0, 11:36] = 1.0  # user 0: targets 11..20 tie with items 21..35 above the rest
    tied[1, 166:191] = 1.0  # user 1: targets 181..190 tie with items 166..180
    tied[0, 1:11] = tied[1, 191:201] = 2.0  # the fed items above all: excluded, they take no place
    metrics = evaluate_fold(lambda tokens: tied[: len(tokens)], fold, 202)
    assert metrics["recall@20"] == 0.5 and metrics["recall@50"] == 1.0


def test_held_out_users_with_nan_scores_are_refused():
    from recserve.errors import EvaluationError
    from recserve.train.heldout import FoldIn

    fold = FoldIn(fed=sequences([[1, 2], [3, 4]]), targets=sequences([[5], [6]]))
    broken = torch.zeros(2, 12)
    broken[1, 7] = float("nan")
    with pytest.raises(EvaluationError, match="1 of 2 held-out users got a NaN or infinite score"):
        evaluate_fold(lambda tokens: broken[: len(tokens)], fold, 12)
    minus_infinity = torch.zeros(2, 12)
    minus_infinity[0, 8] = -float("inf")  # a rankable item: refused like NaN
    with pytest.raises(EvaluationError, match="1 of 2 held-out users"):
        evaluate_fold(lambda tokens: minus_infinity[: len(tokens)], fold, 12)
    excluded = torch.zeros(2, 12)
    excluded[0, [0, 1, 11]] = float("nan")  # padding, a fed item and the reserved index: never ranked
    evaluate_fold(lambda tokens: excluded[: len(tokens)], fold, 12)


def test_multvae_beats_popularity_clearly_on_ml100k(vae_run):
    metrics = json.loads((vae_run / METRICS_FILE).read_text())
    ours, pop = metrics["test"]["heldout"], metrics["popularity"]["heldout"]
    assert ours["ndcg@100"] > 1.3 * pop["ndcg@100"]
    assert ours["recall@20"] > 1.3 * pop["recall@20"]
    assert metrics["model"] == "multvae" and metrics["valid"]["name"] == "held-out users"
    assert metrics["split"]["test_users"] == metrics["split"]["valid_users"] > 80
