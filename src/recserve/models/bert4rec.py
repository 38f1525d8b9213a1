"""BERT4Rec: a bidirectional transformer over item sequences, trained with the Cloze task.

Sun et al., "BERT4Rec: Sequential Recommendation with Bidirectional Encoder Representations from
Transformer", CIKM 2019. Index 0 is padding, items are 1..N, N + 1 is the mask token. The transformer
itself is ``models.transformer``, shared with SASRec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from recserve.errors import ConfigError
from recserve.models.config import ModelConfig
from recserve.models.transformer import ItemTransformer, transformer_problems


@dataclass(frozen=True)
class Bert4RecConfig(ModelConfig):
    MODEL: ClassVar[str] = "bert4rec"

    num_items: int  # N, the catalogue size; the vocabulary adds padding (0) and the mask token (N + 1)
    window: int = 100  # longest input, the mask token included
    hidden: int = 64  # embedding and model width
    layers: int = 1  # transformer blocks (1 does best on ML-100K-sized data: docs/quality.md)
    heads: int = 2  # attention heads; hidden must divide by it
    dropout: float = 0.2  # on embeddings, attention and feed-forward outputs
    mask_prob: float = 0.4  # Cloze masking probability in training (the paper: 0.2 on MovieLens, 0.4 on Steam)

    def validate(self) -> None:
        problems = transformer_problems(self)
        if not 0 < self.mask_prob < 1:
            problems.append(f"mask_prob={self.mask_prob}: must be in (0, 1)")
        if problems:
            raise ConfigError("bad BERT4Rec config: " + "; ".join(problems))


class Bert4Rec(ItemTransformer):
    """Bidirectional attention; BERT's prediction head (dense, GELU, layer norm) before the tied output layer
    with a bias, as in the original."""

    def __init__(self, cfg: Bert4RecConfig):
        super().__init__(cfg, nn.Sequential(nn.Linear(cfg.hidden, cfg.hidden), nn.GELU(), nn.LayerNorm(cfg.hidden)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, L) with the mask token last. Returns the scores of the mask position (B, N + 2): the
        inference fast path."""
        return self.logits(self.encode_last(tokens))
