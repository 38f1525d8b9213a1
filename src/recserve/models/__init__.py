"""Recommendation models and the ID-in, top-k-out inference graph."""

from recserve.models.bert4rec import Bert4Rec, Bert4RecConfig
from recserve.models.multvae import MultVAE, MultVAEConfig

__all__ = ["Bert4Rec", "Bert4RecConfig", "MultVAE", "MultVAEConfig"]
