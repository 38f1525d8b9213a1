"""Recommendation models and the ID-in, top-k-out inference graph.

The names below load on first use, so ``recserve.models.model_configs`` (the configs, no torch) imports alone.
"""

from importlib import import_module
from typing import Any

_HOMES = {
    "Bert4Rec": "bert4rec",
    "MultVAE": "multvae",
    "SASRec": "sasrec",
    "Bert4RecConfig": "model_configs",
    "MultVAEConfig": "model_configs",
    "SASRecConfig": "model_configs",
}
__all__ = ["Bert4Rec", "Bert4RecConfig", "MultVAE", "MultVAEConfig", "SASRec", "SASRecConfig"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'recserve.models' has no attribute {name!r}")
    return getattr(import_module(f"recserve.models.{_HOMES[name]}"), name)
