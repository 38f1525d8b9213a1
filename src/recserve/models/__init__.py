"""Recommendation models and the ID-in, top-k-out inference graph."""

from recserve.models.bert4rec import Bert4Rec, Bert4RecConfig
from recserve.models.multvae import MultVAE, MultVAEConfig
from recserve.models.sasrec import SASRec, SASRecConfig

__all__ = ["Bert4Rec", "Bert4RecConfig", "MultVAE", "MultVAEConfig", "SASRec", "SASRecConfig"]
