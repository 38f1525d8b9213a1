"""Synthetic runs, histories and interaction logs for speed benchmarks at catalogue sizes the shipped data
does not reach.

A synthetic run has random weights: its answers are meaningless, its speed is exactly a trained model's.
A synthetic log draws items by a Zipf-like popularity (rank^-0.8: a long tail in which nearly every item
still occurs) with Poisson history lengths.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import torch

from recserve.artifacts.catalogue import write_catalogue
from recserve.artifacts.item_table import Attribute, ItemAttributes, write_attributes
from recserve.artifacts.popularity import write_popularity
from recserve.artifacts.run_metrics import merge_metrics
from recserve.constants import MODEL_CONFIG_FILE, WEIGHTS_FILE
from recserve.data.sequences import Sequences
from recserve.models.model_configs import Bert4RecConfig, SASRecConfig
from recserve.models.registry import model_entry

ZIPF_EXPONENT = 0.8  # a synthetic log's item popularity ~ 1 / rank^0.8
CATEGORIES = 20  # a synthetic run's items' category attribute: "c00".."c19", item ID modulo 20


SERVING_BENCH_MODEL = "bert4rec"  # the PoC's model: what the serving benchmarks and their targets are stated for


def make_random_run(
    out: Path,
    num_items: int = 100_000,
    hidden: int = 256,
    layers: int = 2,
    heads: int = 4,
    window: int = 40,
    seed: int = 0,
    model: str = SERVING_BENCH_MODEL,
    **options,
) -> Path:
    """A run folder of ``model`` (bert4rec or sasrec; ``options``: more of its config's fields) with random
    weights, item IDs 1..N, Zipf-like popularity and a ``category`` attribute for rules (``CATEGORIES``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    entry = model_entry(model)
    if not entry.sequential:
        raise ValueError(f"model={model!r}: a random run is of bert4rec or sasrec")
    model_class = entry.module_class()
    config_class = cast(type[Bert4RecConfig] | type[SASRecConfig], entry.config)  # a sequential model's
    cfg = config_class(num_items=num_items, window=window, hidden=hidden, layers=layers, heads=heads, **options)
    cfg.save(out / MODEL_CONFIG_FILE)
    torch.save(model_class(cfg).state_dict(), out / WEIGHTS_FILE)
    write_catalogue(out, np.arange(1, num_items + 1, dtype=np.int64))
    counts = (1e6 / np.arange(1, num_items + 1)).astype(np.int64)
    write_popularity(out, np.concatenate([[0], counts, [0]]))
    merge_metrics(out, {"model": model, "random_weights": True})
    names = np.array([f"c{n:02d}" for n in range(CATEGORIES)])
    codes = (np.arange(1, num_items + 1) % CATEGORIES).astype(np.int32)
    write_attributes(out, ItemAttributes(num_items, {"category": Attribute("category", "string", codes, names)}))
    return out


def synthetic_histories(
    num_items: int, count: int = 1000, min_length: int = 5, max_length: int = 60, seed: int = 0
) -> list[np.ndarray]:
    """Histories of Zipf-distributed item IDs 1..N with lengths uniform in [min_length, max_length]."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_length, max_length + 1, count)
    return [(rng.zipf(1.1, n) - 1) % num_items + 1 for n in lengths]


def native_histories(num_items: int, count: int, length: int, seed: int = 0) -> np.ndarray:
    """``count`` of ``synthetic_histories`` as a native model takes them: (count, ``length``) int64, each the most
    recent ``length`` IDs, padding before them (``native_export.padded``)."""
    from recserve.export.native_export import padded

    histories = synthetic_histories(num_items, count=count, seed=seed)
    lengths = np.array([len(h) for h in histories])
    ids = np.zeros((count, max(lengths)), dtype=np.int64)
    for row, history in enumerate(histories):
        ids[row, ids.shape[1] - len(history) :] = history
    return padded(ids, lengths, length)


def zipf_log(users: int, items: int, per_user: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A log of ``users`` x ``per_user`` (Poisson, at least 5) interactions: ``user_id``, ``item_id`` (0..N-1)
    and ``timestamp`` columns, each user's rows together and items drawn by a Zipf-like popularity."""
    rng = np.random.default_rng(seed)
    lengths = rng.poisson(per_user, users).clip(5)
    a = 1 - ZIPF_EXPONENT  # inverse CDF of a density proportional to rank^-0.8 on [1, items + 1)
    ranks = ((((items + 1) ** a - 1) * rng.random(lengths.sum()) + 1) ** (1 / a)).astype(np.int64) - 1
    return {
        "user_id": np.repeat(np.arange(users), lengths),
        "item_id": rng.permutation(items)[np.minimum(ranks, items - 1)],
        "timestamp": rng.integers(1_600_000_000, 1_700_000_000, lengths.sum()),
    }


def write_zipf_log(path: Path, users: int, items: int, per_user: int, seed: int = 0) -> None:
    """``zipf_log`` as a Parquet file that `recserve data` reads."""
    import polars as pl  # here: the serving side of recserve needs no polars

    pl.DataFrame(zipf_log(users, items, per_user, seed)).write_parquet(path)


def zipf_sequences(users: int, items: int, per_user: int, seed: int = 0) -> Sequences:
    """``zipf_log`` as the per-user sequences a prepared folder holds (item indices 1..N, in log order)."""
    log = zipf_log(users, items, per_user, seed)
    lengths = np.bincount(log["user_id"], minlength=users)
    return Sequences(items=log["item_id"] + 1, offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


@dataclass(frozen=True)
class MarkovWorld:
    """A catalogue with sequence in it: items in clusters of about ``cluster_size``, shoppers walking between
    clusters by a fixed Markov chain (each cluster leads to itself with ``stay``, else to its few successors),
    each step's item drawn within the cluster by a Zipf-like popularity (rank^-1). The best possible
    predictor of the next item knows the chain: ``ceiling_ndcg10`` scores it."""

    cluster_of: np.ndarray  # (N,) each item's cluster
    within: np.ndarray  # (N,) each item's probability within its cluster
    successors: np.ndarray  # (C, S) each cluster's successors
    moves: np.ndarray  # (S,) the probability of each successor (summing to 1 - stay)
    stay: float
    start: np.ndarray  # (C,) where walks start
    members: np.ndarray  # (C, M) each cluster's items, -1 past its own

    def next_item_probabilities(self, clusters: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For shoppers in ``clusters`` (B,): the candidates (B, (1 + S) M) and their probabilities of being the
        next item (the clusters' items the chain can reach; every other item has probability 0)."""
        reach = np.concatenate([clusters[:, None], self.successors[clusters]], axis=1)  # (B, 1 + S)
        weight = np.concatenate([np.full(1, self.stay), self.moves])  # (1 + S,)
        candidates = self.members[reach].reshape(len(clusters), -1)  # (B, (1 + S) M)
        cluster_weight = np.repeat(weight, self.members.shape[1])[None, :]
        probabilities = np.where(candidates >= 0, cluster_weight * self.within[candidates.clip(0)], 0.0)
        return candidates, probabilities


def markov_world(items: int, cluster_size: int = 100, successors: int = 3, stay: float = 0.5, seed: int = 0):
    """A ``MarkovWorld`` of ``items`` items, its clusters and chain drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    clusters = max(2, items // cluster_size)
    cluster_of = rng.permutation(np.arange(items) % clusters)
    order = np.argsort(cluster_of, kind="stable")
    sizes = np.bincount(cluster_of, minlength=clusters)
    rank = np.arange(items) - np.repeat(np.cumsum(sizes) - sizes, sizes)  # each item's rank within its cluster
    within = np.empty(items)
    within[order] = 1.0 / (rank + 1)
    within /= np.bincount(cluster_of, weights=within, minlength=clusters)[cluster_of]
    members = np.full((clusters, int(sizes.max())), -1, dtype=np.int64)
    members[cluster_of[order], rank] = order
    others = np.arange(clusters)
    nexts = np.stack([rng.choice(np.delete(others, c), successors, replace=False) for c in range(clusters)])
    moves = 0.5 ** np.arange(successors)  # the first successor the likeliest, each next half as likely
    moves = moves / moves.sum() * (1 - stay)
    start = 1.0 / np.arange(1, clusters + 1) ** ZIPF_EXPONENT
    start = rng.permutation(start / start.sum())
    return MarkovWorld(cluster_of, within, nexts, moves, stay, start, members)


def markov_log(
    users: int, items: int, per_user: int, seed: int = 0, world: MarkovWorld | None = None
) -> tuple[dict[str, np.ndarray], MarkovWorld]:
    """A log of ``users`` walks through ``world`` (default ``markov_world(items)``), Poisson lengths of mean
    ``per_user`` (at least 5), as ``zipf_log`` lays it out (item IDs 0..N-1, each walk's rows in order)."""
    world = world or markov_world(items, seed=seed)
    rng = np.random.default_rng(seed + 1)
    lengths = rng.poisson(per_user, users).clip(5)
    steps = int(lengths.max())
    cumulative_within = _cumulative_rows(world.members, world.within)
    cluster = rng.choice(len(world.start), users, p=world.start)
    walks = np.empty((users, steps), dtype=np.int64)
    choices = np.concatenate([[world.stay], world.moves]).cumsum()
    for step in range(steps):  # a step of every walk at once
        if step:
            pick = np.searchsorted(choices, rng.random(users) * choices[-1], side="right").clip(max=len(choices) - 1)
            moved = pick > 0
            cluster = np.where(moved, world.successors[cluster, (pick - 1).clip(0)], cluster)
        walks[:, step] = world.members[cluster, _draw(cumulative_within[cluster], rng.random(users))]
    keep = np.arange(steps)[None, :] < lengths[:, None]
    return {
        "user_id": np.repeat(np.arange(users), lengths),
        "item_id": walks[keep],
        "timestamp": np.tile(np.arange(steps), (users, 1))[keep] + 1_600_000_000,
    }, world


def _cumulative_rows(members: np.ndarray, within: np.ndarray) -> np.ndarray:
    """Each cluster's cumulative item probabilities, 1 past its own items (so a draw never lands there)."""
    probabilities = np.where(members >= 0, within[members.clip(0)], 0.0)
    cumulative = probabilities.cumsum(1)
    cumulative[members < 0] = 2.0
    return cumulative


def _draw(cumulative: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """Per row the first column whose cumulative probability passes the row's uniform draw."""
    return (cumulative < uniform[:, None]).sum(1).clip(max=cumulative.shape[1] - 1)


def ceiling_ndcg10(world: MarkovWorld, histories: Sequences, catalogue: np.ndarray) -> float:
    """The test NDCG@10 the best possible predictor expects under the full protocol (the history excluded
    from the ranking but for the target itself, which stays rankable where it repeats an item of the history;
    only items of ``catalogue``; a tie counts against the target). That predictor scores the history's items
    above all others (a repeated target then ranks first, the other seen items being removed) and the rest by
    their probability of being next after the last item's cluster; the gain of each rank is weighted by that
    probability: an expectation over the targets the chain may draw, one a history.

    Args:
        histories: the test inputs, item IDs 0..N-1 (``Sequences`` of the original IDs).
        catalogue: (K,) the item IDs the prepared data kept.
    """
    users = histories.num_users
    last = histories.items[histories.offsets[1:] - 1]
    gains = np.zeros(users)
    discount = 1.0 / np.log2(np.arange(2, 12))
    in_catalogue = np.zeros(len(world.cluster_of), dtype=bool)
    in_catalogue[catalogue] = True
    for start in range(0, users, 20_000):  # chunks of histories, every one at once
        rows = np.arange(start, min(start + 20_000, users))
        candidates, probabilities = world.next_item_probabilities(world.cluster_of[last[rows]])
        lengths = histories.offsets[rows + 1] - histories.offsets[rows]
        chunk = histories.items[histories.offsets[rows[0]] : histories.offsets[rows[-1] + 1]]
        seen_keys = np.repeat(rows - start, lengths) * (len(world.cluster_of) + 1) + chunk
        keys = (np.arange(len(rows))[:, None] * (len(world.cluster_of) + 1) + candidates.clip(0)).reshape(-1)
        seen = np.isin(keys, seen_keys).reshape(candidates.shape)
        probabilities = np.where(~in_catalogue[candidates.clip(0)] | (candidates < 0), 0.0, probabilities)
        order = np.argsort(-probabilities, axis=1, kind="stable")
        ranked, seen = np.take_along_axis(probabilities, order, 1), np.take_along_axis(seen, order, 1)
        # were it the target, an item's rank is the count of other unseen items scoring at least as high (a
        # tie counts against it, as the evaluation counts it): up to the end of its group of equal scores
        width = ranked.shape[1]
        last_of_group = np.concatenate([ranked[:, 1:] != ranked[:, :-1], np.ones((len(rows), 1), bool)], axis=1)
        ends = np.where(last_of_group, np.arange(1, width + 1), width)
        end = np.minimum.accumulate(ends[:, ::-1], axis=1)[:, ::-1]  # each column's group's end
        unseen_upto = np.concatenate([np.zeros((len(rows), 1), dtype=np.int64), np.cumsum(~seen, axis=1)], axis=1)
        # a seen item, were it the target, ranks first: the protocol removes the other seen items, and the best
        # predictor scores every seen item above every unseen one
        rank = np.where(seen, 0, np.take_along_axis(unseen_upto, end, 1) - 1)
        gains[rows] = np.where(rank < 10, ranked * discount[rank.clip(max=9)], 0.0).sum(1)
    return float(gains.mean())


def write_markov_log(path: Path, users: int, items: int, per_user: int, seed: int = 0) -> MarkovWorld:
    """``markov_log`` as a Parquet file that `recserve data` reads; returns its world (for the ceiling)."""
    import polars as pl  # here: the serving side of recserve needs no polars

    log, world = markov_log(users, items, per_user, seed)
    pl.DataFrame(log).write_parquet(path)
    return world


def prepared_ceiling(world: MarkovWorld, data) -> float:
    """``ceiling_ndcg10`` on a prepared folder of a ``markov_log`` (``data``: ``load_prepared``'s), on its test
    split: each user's history but the last item, which is the target."""
    inputs = data.sequences.truncated(1)
    histories = Sequences(items=data.vocab.ids[inputs.items - 1].astype(np.int64), offsets=inputs.offsets)
    return ceiling_ndcg10(world, histories, data.vocab.ids.astype(np.int64))
