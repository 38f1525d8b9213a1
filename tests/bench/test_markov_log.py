"""The generated logs with sequence in them (benchmarks/train_scale.py's default): the ceiling is what the best
predictor expects, held against a brute-force reading of the chain and against that predictor's own NDCG on
the targets the walks drew, and through `recserve data` on a prepared folder."""

import numpy as np
import pytest

from recserve.bench.synthetic import ceiling_ndcg10, markov_log, prepared_ceiling, write_markov_log
from recserve.data.sequences import Sequences

ITEMS = 600


def _split(log: dict) -> tuple[Sequences, np.ndarray]:
    """Each walk but its last item, and the last items (the test split of leave-one-out)."""
    lengths = np.bincount(log["user_id"])
    ends = np.cumsum(lengths)
    keep = np.ones(len(log["item_id"]), dtype=bool)
    keep[ends - 1] = False
    offsets = np.concatenate([[0], np.cumsum(lengths - 1)])
    return Sequences(items=log["item_id"][keep], offsets=offsets), log["item_id"][ends - 1]


def _next_item(world, last: int) -> np.ndarray:
    """The chain's next-item probabilities after ``last``, read item by item."""
    probabilities = np.zeros(ITEMS)
    cluster = world.cluster_of[last]
    for weight, reached in zip([world.stay, *world.moves], [cluster, *world.successors[cluster]]):
        members = world.members[reached][world.members[reached] >= 0]
        probabilities[members] += weight * world.within[members]
    return probabilities


def test_the_ceiling_is_what_the_best_predictor_expects_and_gets():
    log, world = markov_log(1500, ITEMS, 25, seed=3)
    histories, targets = _split(log)
    catalogue = np.unique(log["item_id"])
    ceiling = ceiling_ndcg10(world, histories, catalogue)
    discount = 1 / np.log2(np.arange(2, 12))
    expected, got = [], []
    for user in range(histories.num_users):
        seen = histories.items[histories.offsets[user] : histories.offsets[user + 1]]
        probabilities = _next_item(world, seen[-1])
        probabilities[np.setdiff1d(np.arange(ITEMS), catalogue)] = 0.0
        unseen = ~np.isin(np.arange(ITEMS), seen)
        # the full protocol: seen items leave the ranking, but for the target itself; ties count against it. The
        # best predictor scores the seen items above the rest: a repeated target ranks first
        reachable = np.flatnonzero(probabilities > 0)
        rank = {
            i: 0 if not unseen[i] else int((unseen & (probabilities >= probabilities[i])).sum() - 1) for i in reachable
        }
        expected.append(sum(probabilities[i] * discount[r] for i, r in rank.items() if r < 10))
        target = targets[user]
        got.append(discount[rank[target]] if target in rank and rank[target] < 10 else 0.0)
    assert ceiling == pytest.approx(np.mean(expected), rel=1e-9)
    assert abs(np.mean(got) - ceiling) < 4 * np.std(got) / np.sqrt(len(got))  # the walks' own targets
    assert 0.05 < ceiling < 0.5  # a log a model can learn something from, and not everything


def test_walks_follow_the_chain():
    log, world = markov_log(400, ITEMS, 30, seed=1)
    lengths = np.bincount(log["user_id"])
    assert lengths.min() >= 5 and log["item_id"].max() < ITEMS
    first = np.ones(len(log["item_id"]), dtype=bool)
    first[np.concatenate([[0], np.cumsum(lengths)[:-1]])] = False
    before, after = world.cluster_of[log["item_id"][:-1]][first[1:]], world.cluster_of[log["item_id"][1:]][first[1:]]
    allowed = np.concatenate([before[:, None], world.successors[before]], axis=1)
    assert (allowed == after[:, None]).any(1).all()  # every step stays or goes to a successor
    assert abs((before == after).mean() - world.stay) < 0.05


def test_the_ceiling_of_a_prepared_folder(tmp_path):
    from recserve.data.datasets import load_prepared, prepare

    world = write_markov_log(tmp_path / "log.parquet", 300, ITEMS, 20, seed=2)
    prepare(str(tmp_path / "log.parquet"), tmp_path / "data")
    data = load_prepared(tmp_path / "data")
    log, _ = markov_log(300, ITEMS, 20, seed=2)
    histories, _ = _split(log)
    assert prepared_ceiling(world, data) == pytest.approx(
        ceiling_ndcg10(world, histories, np.unique(log["item_id"])), rel=1e-9
    )
