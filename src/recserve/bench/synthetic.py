"""Synthetic runs, histories and interaction logs for speed benchmarks at catalogue sizes the shipped data
does not reach.

A synthetic run has random weights: its answers are meaningless, its speed is exactly a trained model's.
A synthetic log draws items by a Zipf-like popularity (rank^-0.8: a long tail in which nearly every item
still occurs) with Poisson history lengths.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import numpy as np
import torch

from recserve.artifacts.catalogue import write_catalogue
from recserve.constants import METRICS_FILE, MODEL_CONFIG_FILE, POPULARITY_FILE, WEIGHTS_FILE
from recserve.data.sequences import Sequences
from recserve.models.model_configs import Bert4RecConfig, SASRecConfig
from recserve.models.registry import model_entry

ZIPF_EXPONENT = 0.8  # a synthetic log's item popularity ~ 1 / rank^0.8


def make_random_run(
    out: Path,
    num_items: int = 100_000,
    hidden: int = 256,
    layers: int = 2,
    heads: int = 4,
    window: int = 40,
    seed: int = 0,
    model: str = "bert4rec",
    **options,
) -> Path:
    """A run folder of ``model`` (bert4rec or sasrec; ``options``: more of its config's fields) with random
    weights, item IDs 1..N and Zipf-like popularity."""
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
    np.save(out / POPULARITY_FILE, np.concatenate([[0], counts, [0]]))
    (out / METRICS_FILE).write_text(json.dumps({"model": model, "random_weights": True}) + "\n")
    return out


def synthetic_histories(
    num_items: int, count: int = 1000, min_length: int = 5, max_length: int = 60, seed: int = 0
) -> list[np.ndarray]:
    """Histories of Zipf-distributed item IDs 1..N with lengths uniform in [min_length, max_length]."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_length, max_length + 1, count)
    return [(rng.zipf(1.1, n) - 1) % num_items + 1 for n in lengths]


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
