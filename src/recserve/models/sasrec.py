"""SASRec: a causal transformer over item sequences that predicts the next item at every position.

Kang & McAuley, "Self-Attentive Sequential Recommendation", ICDM 2018; trained with the full-catalogue
cross-entropy of Klenitskiy & Vasilev, "Turning Dross Into Gold Loss: is BERT4Rec really better than
SASRec?", RecSys 2023 (or the sampled softmax at large catalogues). The transformer is
``models.transformer``, shared with BERT4Rec; the output layer is the item embeddings themselves (with a
bias). The index space is BERT4Rec's (0 padding, items 1..N, N + 1 reserved): serving appends the reserved
token after the history as it does for BERT4Rec, and SASRec reads the history before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from recserve.constants import PAD_INDEX
from recserve.errors import ConfigError
from recserve.models.config import ModelConfig
from recserve.models.transformer import ItemTransformer, transformer_problems


@dataclass(frozen=True)
class SASRecConfig(ModelConfig):
    MODEL: ClassVar[str] = "sasrec"

    num_items: int  # N, the catalogue size; the vocabulary adds padding (0) and a reserved index (N + 1)
    window: int = 100  # longest input the serving graph builds: window - 1 history items and the reserved token
    hidden: int = 64  # embedding and model width
    layers: int = 2  # transformer blocks
    heads: int = 1  # attention heads; hidden must divide by it
    dropout: float = 0.2  # on embeddings, attention and feed-forward outputs

    def validate(self) -> None:
        problems = transformer_problems(self)
        if problems:
            raise ConfigError("bad SASRec config: " + "; ".join(problems))


class SASRec(ItemTransformer):
    """Causal attention; the last hidden state scores the next item against the tied item embeddings."""

    causal = True

    def __init__(self, cfg: SASRecConfig):
        super().__init__(cfg, nn.Identity())

    @staticmethod
    def history(tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, L) with the reserved token last. Returns (B, L): the history, one padding column in front.

        The padding column keeps the width at least one for an empty history, so the graph has no
        data-dependent shape.
        """
        return F.pad(tokens[:, :-1], (1, 0), value=PAD_INDEX)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, L) with the reserved token last (the serving graph's input, as for BERT4Rec).
        Returns the next-item scores after the history (B, N + 2): the inference fast path."""
        return self.logits(self.encode_last(self.history(tokens)))
