"""The training objectives over a batch of positions: BERT4Rec's Cloze task (the masked positions) and
SASRec's next item (every position). Both score only the positions that count, never the whole (B, L).
A sampled loss takes its negatives from ``CatalogueLoss.draw``, made before the call (None: drawn in it)."""

from __future__ import annotations

import torch

from recserve.models.transformer import ItemTransformer
from recserve.train.batches import PositionBatch
from recserve.train.losses import CatalogueLoss


def cloze_loss(
    model: ItemTransformer, batch: PositionBatch, loss: CatalogueLoss, negatives: torch.Tensor | None = None
) -> torch.Tensor:
    """The batch's mean cross-entropy over masked positions (scaled by ``batch.weight`` for DDP).

    With ``exclude_seen``, each position's softmax leaves out the sample's other items, masked or not.
    """
    exclude = batch.items if loss.settings.exclude_seen else None
    return _positions_loss(model, batch, loss, exclude, batch.rows, negatives)


def next_item_loss(
    model: ItemTransformer, batch: PositionBatch, loss: CatalogueLoss, negatives: torch.Tensor | None = None
) -> torch.Tensor:
    """The batch's mean cross-entropy of the next item at every scored position (causal attention).

    With ``exclude_seen``, each position's softmax leaves out the items up to and including that position
    (what the user has seen by then), never a later one.
    """
    if not loss.settings.exclude_seen:
        return _positions_loss(model, batch, loss, None, None, negatives)
    seen = batch.items[:, : batch.tokens.shape[1]]  # the inputs as they were, masked ones included
    return _positions_loss(model, batch, loss, seen, batch.rows, negatives, upto=batch.cols)


def _positions_loss(model, batch, loss, exclude, rows, negatives, upto=None) -> torch.Tensor:
    table = model.item_vectors()  # (V, H): made once a step, for the inputs and the output layer alike
    hidden = model.encode(batch.tokens, table)  # (B, L, H)
    query = model.head(hidden[batch.rows, batch.cols])  # (C, H): the scored positions only
    per_position = loss(query, table, model.item_bias(), batch.targets, exclude, rows, negatives, upto)
    return per_position.sum() * batch.weight
