"""How well new items are ranked: the test targets that no earlier event holds, each ranked among the new items
alone (the catalogue's items that no event before the test holds), against two baselines that know only the
items' attributes.

A model that learns items by their attributes (``--item-attributes``) can rank an item that no training
event holds; an ID-trained model cannot (its new items' scores are whatever training left them). The question a
shop asks is which of today's new items to show, so the targets are ranked among those, seen items excluded and
ties counted against the target, as every other protocol here.

Baselines, by the attributes' codes (``models.attribute_codes``):
- ``attribute_popularity``: an item scores the sum over its attributes of log(1 + the training events on
  items of the same value): the popularity of its genre, its year's bin.
- ``attribute_profile``: an item scores how many of the user's own history items share each of its
  attribute values (the user's genres), ties broken by ``attribute_popularity``.
"""

from __future__ import annotations

import numpy as np
import torch

from recserve.constants import PAD_INDEX
from recserve.data.sequences import Sequences
from recserve.models.attribute_codes import AttributeCodes
from recserve.train.leave_one_out import Ranker, ScoreFn, popularity_score_fn
from recserve.train.metrics import ranking_metrics

TIE_BREAK = 1e-3  # attribute_profile: popularity's weight beside the user's own counts


def only_among(score_fn: ScoreFn, items: torch.Tensor) -> ScoreFn:
    """``score_fn`` with every item outside ``items`` ((V,) bool) scored below any item inside (the lowest
    finite float32: the ranking refuses a score that is not finite)."""
    return lambda tokens: score_fn(tokens).float().masked_fill(~items, torch.finfo(torch.float32).min)


def attribute_popularity(codes: AttributeCodes, counts: np.ndarray) -> np.ndarray:
    """(V,): each item's sum over its attributes of log(1 + events on items of its value)."""
    by_code = np.bincount(codes.codes.ravel(), weights=np.tile(counts, len(codes.names)), minlength=codes.rows)
    by_code[0] = 0.0  # no attribute: no popularity
    return np.log1p(by_code)[codes.codes].sum(0)


def attribute_profile_fn(codes: AttributeCodes, counts: np.ndarray, device: str | torch.device) -> ScoreFn:
    """Scores each item by the user's history items that share its attribute values (``attribute_profile``)."""
    by_item = torch.as_tensor(codes.codes, device=device)  # (A, V)
    tie_break = torch.as_tensor(attribute_popularity(codes, counts) * TIE_BREAK, dtype=torch.float32, device=device)

    def scores(tokens: torch.Tensor) -> torch.Tensor:
        real = (tokens != PAD_INDEX) & (tokens < by_item.shape[1] - 1)  # history items, not the mask token
        profile = torch.zeros(tokens.shape[0], codes.rows, device=tokens.device)  # (B, rows) the user's counts
        for column in by_item:
            profile.scatter_add_(1, column[tokens], real.float())
        profile[:, 0] = 0.0  # no attribute
        return sum((profile[:, column] for column in by_item), tie_break.expand(tokens.shape[0], -1))

    return scores


def new_item_metrics(
    model: ScoreFn,
    inputs: Sequences,
    targets: np.ndarray,
    trained_counts: np.ndarray,
    codes: AttributeCodes,
    window: int,
    mask_index: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> dict | None:
    """The test targets that no earlier event holds, each ranked among the new items alone, by the model and
    the attribute baselines (full ranking, seen excluded, ties against the target); None where no target is new.

    Args:
        trained_counts: (V,) events on each item before the test targets (what a model could learn from).
        codes: the catalogue's attribute codes (none: the baselines are left out).
    """
    new = trained_counts == 0
    new[[PAD_INDEX, mask_index]] = False
    cold = new[targets]
    if not cold.any():
        return None
    users = np.flatnonzero(cold)
    ranker = Ranker(inputs.select(users), targets[users], trained_counts, window, mask_index, device=device, seed=seed)
    among = torch.as_tensor(new, device=device)
    scorers = {"model": model}
    if codes.rows:
        scorers |= {
            "attribute_popularity": popularity_score_fn(attribute_popularity(codes, trained_counts), device),
            "attribute_profile": attribute_profile_fn(codes, trained_counts, device),
        }
    ranked = {name: ranker.ranks(only_among(fn, among), ("full",))["full"] for name, fn in scorers.items()}
    return {
        "targets": len(users),
        "new_items": int(new.sum()),
        "ranking": "among the new items alone; seen excluded; ties against the target",
        **{name: ranking_metrics(ranks) for name, ranks in ranked.items()},
    }
