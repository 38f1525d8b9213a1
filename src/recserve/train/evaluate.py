"""Leave-one-out evaluation: full ranking (seen items excluded, or not) and the sampled protocol.

The sampled protocol is the BERT4Rec paper's: the target against 100 negatives drawn by popularity,
never from the user's history, with a fixed seed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from recserve.constants import PAD_INDEX
from recserve.data.sequences import Sequences
from recserve.train.metrics import ranking_metrics

log = logging.getLogger(__name__)

ScoreFn = Callable[[torch.Tensor], torch.Tensor]  # (B, L) tokens -> (B, N + 2) scores
SAMPLED_NEGATIVES = 100
PROTOCOLS = ("full", "full_no_exclusion", "sampled")


def _target_ranks(scores: torch.Tensor, targets: torch.Tensor, candidates: torch.Tensor | None) -> torch.Tensor:
    """0-based rank of each target among the candidates (all items where None); ties count against it."""
    target_scores = scores.gather(1, targets[:, None])  # (B, 1)
    if candidates is not None:
        scores = scores.gather(1, candidates)
    return (scores > target_scores).sum(1)


def rank_targets(
    score_fn: ScoreFn,
    inputs: Sequences,
    targets: np.ndarray,
    window: int,
    mask_index: int,
    popularity: np.ndarray,
    batch_size: int = 256,
    seed: int = 0,
    device: str | torch.device = "cpu",
    protocols: tuple[str, ...] = PROTOCOLS,
) -> dict[str, np.ndarray]:
    """Ranks every user's target under the three protocols.

    Args:
        score_fn: the model's scores for the last position of left-padded token windows.
        inputs: each user's history before the target.
        targets: (users,) target item indices.
        window: model window; the history keeps its ``window - 1`` most recent items.
        mask_index: the mask token appended to each history.
        popularity: (N + 2,) item counts, for drawing sampled negatives.

    Returns:
        0-based ranks under ``full`` (seen excluded), ``full_no_exclusion`` and ``sampled``.
    """
    generator = torch.Generator().manual_seed(seed)
    weights_all = torch.as_tensor(popularity, dtype=torch.float64)
    out: dict[str, list[np.ndarray]] = {name: [] for name in protocols}
    lengths = inputs.lengths
    for start in range(0, inputs.num_users, batch_size):
        users = np.arange(start, min(start + batch_size, inputs.num_users))
        history = inputs.windows(users, lengths[users], window - 1)
        tokens = torch.as_tensor(np.concatenate([history, np.full((len(users), 1), mask_index)], axis=1))
        target = torch.as_tensor(targets[users])
        with torch.no_grad():
            scores = score_fn(tokens.to(device)).float().cpu()  # (B, V)
        scores[:, PAD_INDEX] = -torch.inf
        scores[:, mask_index] = -torch.inf
        if "full_no_exclusion" in out:
            out["full_no_exclusion"].append(_target_ranks(scores, target, None).numpy())
        seen = seen_mask(inputs, users, scores.shape[1])
        seen[torch.arange(len(users)), target] = False  # a repeated target stays rankable
        if "full" in out:
            out["full"].append(_target_ranks(scores.masked_fill(seen, -torch.inf), target, None).numpy())
        if "sampled" not in out:
            continue
        weights = (weights_all + 1).expand(len(users), -1).clone()  # +1: unseen-in-training items stay drawable
        weights[seen] = 0
        weights[torch.arange(len(users)), target] = 0
        weights[:, [PAD_INDEX, mask_index]] = 0
        count = min(SAMPLED_NEGATIVES, int((weights > 0).sum(1).min()))
        negatives = torch.multinomial(weights, count, replacement=False, generator=generator)
        out["sampled"].append(_target_ranks(scores, target, negatives).numpy())
    return {name: np.concatenate(parts) for name, parts in out.items()}


def seen_mask(inputs: Sequences, users: np.ndarray, vocab_size: int) -> torch.Tensor:
    """(B, V) True at every item in each user's whole history (not only the window)."""
    chosen = inputs.select(users)
    rows = np.repeat(np.arange(len(users)), chosen.lengths)
    seen = torch.zeros(len(users), vocab_size, dtype=torch.bool)
    seen[torch.as_tensor(rows), torch.as_tensor(chosen.items)] = True
    return seen


def popularity_score_fn(counts: np.ndarray) -> ScoreFn:
    """Scores every user with the items' interaction counts: the baseline to beat."""
    table = torch.as_tensor(counts, dtype=torch.float32)
    return lambda tokens: table.repeat(tokens.shape[0], 1)


def history_counts(inputs: Sequences, vocab_size: int) -> np.ndarray:
    """Exact interaction counts over the inputs (what a model may see before the targets)."""
    return np.bincount(inputs.items, minlength=vocab_size).astype(np.int64)


def evaluate_protocols(score_fn: ScoreFn, inputs: Sequences, targets: np.ndarray, window: int,
                       mask_index: int, popularity: np.ndarray, **kwargs) -> dict[str, dict[str, float]]:
    """Metrics under each protocol (see ``rank_targets``)."""
    ranks = rank_targets(score_fn, inputs, targets, window, mask_index, popularity, **kwargs)
    return {name: ranking_metrics(r) for name, r in ranks.items()}


def evaluate_run(run_dir, data_dir, seed: int = 0, device: str = "cpu") -> dict:
    """Test metrics of a run and of the popularity baseline under every protocol.

    The test input of each user is the whole sequence but its last item; popularity counts those inputs.
    """
    from recserve.data.datasets import load_prepared
    from recserve.models.runs import load_run

    data = load_prepared(data_dir)
    model = load_run(run_dir).to(device)
    if model.cfg.num_items != data.vocab.num_items:
        from recserve.errors import DataError

        raise DataError(
            f"{data_dir}: {data.vocab.num_items} items, but the run {run_dir} was trained on {model.cfg.num_items}; "
            "evaluate on the data folder it was trained on"
        )
    inputs, targets = data.sequences.truncated(1), data.sequences.last(1)
    counts = history_counts(inputs, data.vocab.size)
    common = dict(window=model.cfg.window, mask_index=model.cfg.mask_index, popularity=counts, seed=seed)
    return {
        "test": evaluate_protocols(model, inputs, targets, device=device, **common),
        "popularity": evaluate_protocols(popularity_score_fn(counts), inputs, targets, **common),
        "test_users": int(inputs.num_users),
        "sampled_negatives": SAMPLED_NEGATIVES,
        "seed": seed,
    }
