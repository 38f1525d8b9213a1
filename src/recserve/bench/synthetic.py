"""Synthetic runs and histories for speed benchmarks at catalogue sizes the shipped data does not reach.

A synthetic run has random weights: its answers are meaningless, its speed is exactly a trained model's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from recserve.constants import ITEM_TABLE_FILE, METRICS_FILE, MODEL_CONFIG_FILE, POPULARITY_FILE, WEIGHTS_FILE
from recserve.models.bert4rec import Bert4Rec
from recserve.models.config import Bert4RecConfig


def make_random_run(
    out: Path,
    num_items: int = 100_000,
    hidden: int = 256,
    layers: int = 2,
    heads: int = 4,
    window: int = 40,
    seed: int = 0,
) -> Path:
    """A run folder with random weights, item IDs 1..N and Zipf-like popularity."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg = Bert4RecConfig(num_items=num_items, window=window, hidden=hidden, layers=layers, heads=heads)
    cfg.save(out / MODEL_CONFIG_FILE)
    torch.save(Bert4Rec(cfg).state_dict(), out / WEIGHTS_FILE)
    np.save(out / ITEM_TABLE_FILE, np.arange(1, num_items + 1, dtype=np.int64))
    counts = (1e6 / np.arange(1, num_items + 1)).astype(np.int64)
    np.save(out / POPULARITY_FILE, np.concatenate([[0], counts, [0]]))
    (out / METRICS_FILE).write_text(json.dumps({"model": "bert4rec", "random_weights": True}) + "\n")
    return out


def synthetic_histories(
    num_items: int, count: int = 1000, min_length: int = 5, max_length: int = 60, seed: int = 0
) -> list[np.ndarray]:
    """Histories of Zipf-distributed item IDs 1..N with lengths uniform in [min_length, max_length]."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_length, max_length + 1, count)
    return [(rng.zipf(1.1, n) - 1) % num_items + 1 for n in lengths]
