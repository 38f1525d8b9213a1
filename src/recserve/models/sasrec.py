"""SASRec: a causal transformer over item sequences that predicts the next item at every position.

Kang & McAuley, "Self-Attentive Sequential Recommendation", ICDM 2018; trained with the full-catalogue
cross-entropy of Klenitskiy & Vasilev, "Turning Dross Into Gold Loss: is BERT4Rec really better than
SASRec?", RecSys 2023 (or the sampled softmax at large catalogues). The transformer is
``models.transformer``, shared with BERT4Rec; the output layer is the item embeddings themselves (with a
bias). The index space is BERT4Rec's (0 padding, items 1..N, N + 1 reserved): serving appends the reserved
token after the history as it does for BERT4Rec, and SASRec reads the history before it.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from recserve.constants import PAD_INDEX
from recserve.models.model_configs import DENSE_DROPOUT, SPARSE_DROPOUT, SPARSE_MEDIAN_LENGTH, SASRecConfig
from recserve.models.transformer import ItemTransformer


def dropout_for(lengths: np.ndarray) -> float:
    """SASRec's default dropout for a data set, from its users' training-history lengths.

    As in the SASRec paper (0.5 on the sparse Amazon and Steam sets, 0.2 on MovieLens): on video.txt
    (median 4 training items) 0.5 gave test NDCG@10 0.0619 against 0.0588 with 0.2, on ML-100K (median 63)
    0.2 gave 0.1043 against 0.0974 with 0.5 (docs/quality.md, SASRec section).
    """
    lengths = np.asarray(lengths)
    lengths = lengths[lengths > 0]
    if lengths.size and np.median(lengths) < SPARSE_MEDIAN_LENGTH:
        return SPARSE_DROPOUT
    return DENSE_DROPOUT


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

    def query(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, L) with the reserved token last (the serving graph's input, as for BERT4Rec).
        Returns the last hidden state after the history (B, H): ``forward`` scores it against the item
        embeddings for the next item."""
        return self.head(self.encode_last(self.history(tokens)))
