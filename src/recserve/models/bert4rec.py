"""BERT4Rec: a bidirectional transformer over item sequences, trained with the Cloze task.

Sun et al., "BERT4Rec: Sequential Recommendation with Bidirectional Encoder Representations from
Transformer", CIKM 2019. Index 0 is padding, items are 1..N, N + 1 is the mask token. The transformer
itself is ``models.transformer``, shared with SASRec.
"""

from __future__ import annotations

import torch
from torch import nn

from recserve.models.model_configs import Bert4RecConfig
from recserve.models.transformer import ItemTransformer


class Bert4Rec(ItemTransformer):
    """Bidirectional attention; BERT's prediction head (dense, GELU, layer norm) before the tied output layer
    with a bias, as in the original."""

    def __init__(self, cfg: Bert4RecConfig):
        super().__init__(cfg, nn.Sequential(nn.Linear(cfg.hidden, cfg.hidden), nn.GELU(), nn.LayerNorm(cfg.hidden)))

    def query(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, L) with the mask token last. Returns the mask position's state after the prediction
        head (B, H): ``forward`` scores it against the item embeddings."""
        return self.head(self.encode_last(tokens))
