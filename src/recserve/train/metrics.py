"""Ranking metrics from the 0-based rank of each user's target item."""

from __future__ import annotations

import numpy as np

HR_KS = (1, 5, 10, 20)
NDCG_KS = (5, 10, 20)


def hit_rate(ranks: np.ndarray, k: int) -> float:
    """Share of users whose target ranks in the top k."""
    return float(np.mean(ranks < k))


def ndcg(ranks: np.ndarray, k: int) -> float:
    """With one relevant item, DCG is 1 / log2(rank + 2) inside the top k and the ideal DCG is 1."""
    return float(np.mean(np.where(ranks < k, 1.0 / np.log2(ranks + 2.0), 0.0)))


def mrr(ranks: np.ndarray) -> float:
    """Mean reciprocal rank over the whole list."""
    return float(np.mean(1.0 / (ranks + 1.0)))


def ranking_metrics(ranks: np.ndarray) -> dict[str, float]:
    """HR@1/5/10/20, NDCG@5/10/20 and MRR, keyed as ``hr@10``."""
    ranks = np.asarray(ranks, dtype=np.float64)
    out = {f"hr@{k}": hit_rate(ranks, k) for k in HR_KS}
    out |= {f"ndcg@{k}": ndcg(ranks, k) for k in NDCG_KS}
    out["mrr"] = mrr(ranks)
    return out
