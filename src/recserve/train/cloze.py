"""BERT4Rec's Cloze objective on a batch: the encoder over the masked windows, the catalogue loss at the
masked positions only (never over the whole (B, L) sequence)."""

from __future__ import annotations

import torch

from recserve.models.bert4rec import Bert4Rec
from recserve.train.batches import ClozeBatch
from recserve.train.losses import CatalogueLoss


def cloze_loss(model: Bert4Rec, batch: ClozeBatch, loss: CatalogueLoss,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """The batch's mean cross-entropy over masked positions (scaled by ``batch.weight`` for DDP)."""
    hidden = model.encode(batch.tokens)  # (B, L, H)
    query = model.head(hidden[batch.rows, batch.cols])  # (C, H): the masked positions only
    per_position = loss(query, model.item_emb.weight, model.out_bias, batch.targets, batch.rows, batch.items,
                        generator)
    return per_position.sum() * batch.weight
