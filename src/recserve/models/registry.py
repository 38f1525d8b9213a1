"""Every model recserve trains and serves, one entry each: its config, its module (imported when asked, so
that reading the registry needs no torch), its training task, the training settings where its usual values
differ from ``TrainConfig``'s, and its evaluation protocol. A model's name is looked up here and nowhere
else compared.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from recserve.errors import DataError
from recserve.models.model_configs import Bert4RecConfig, MultVAEConfig, SASRecConfig

LEAVE_ONE_OUT = "leave-one-out"  # each user's last item the test, the one before it validation
HELD_OUT_USERS = "held-out users"  # users kept out of training, part of each one's items fed (Mult-VAE's)


@dataclass(frozen=True)
class ModelEntry:
    name: str  # what a run's model_config.json names, and --model takes
    config: type[Bert4RecConfig] | type[SASRecConfig] | type[MultVAEConfig]
    module_path: str  # "package.module:Class", imported by ``module_class``
    task: str  # "cloze" (masked items), "next-item" (each position's next), "reconstruction" (a user's bag)
    protocol: str  # LEAVE_ONE_OUT or HELD_OUT_USERS
    # the training settings where the model's usual values differ from TrainConfig's (which are BERT4Rec's)
    defaults: dict[str, Any] = field(default_factory=dict)
    dropout_from_data: bool = False  # its dropout, when not given, is chosen from the data's lengths
    about: str = ""  # what --model's help says of it

    @property
    def sequential(self) -> bool:
        """Whether it reads a history in order (BERT4Rec, SASRec) rather than a bag of items (Mult-VAE)."""
        return self.task != "reconstruction"

    def module_class(self) -> type:
        module, _, name = self.module_path.partition(":")
        return getattr(importlib.import_module(module), name)


MODELS: dict[str, ModelEntry] = {
    entry.name: entry
    for entry in (
        ModelEntry(
            "bert4rec",
            Bert4RecConfig,
            "recserve.models.bert4rec:Bert4Rec",
            "cloze",
            LEAVE_ONE_OUT,
            dict(refit=True),  # docs/quality.md, "Refit on video.txt"
            about="bidirectional, Cloze task; the PoC's model",
        ),
        ModelEntry(
            "sasrec",
            SASRecConfig,
            "recserve.models.sasrec:SASRec",
            "next-item",
            LEAVE_ONE_OUT,
            dict(epochs=100, samples_per_user=2, ema_epochs=1.0, refit=True),  # the average: docs/quality.md
            dropout_from_data=True,
            about="causal, next item at every position; it ranks best on every data set measured",
        ),
        ModelEntry(
            "multvae",
            MultVAEConfig,
            "recserve.models.multvae:MultVAE",
            "reconstruction",
            HELD_OUT_USERS,
            dict(batch_size=100, weight_decay=0.0, epochs=200, patience=20, samples_per_user=1),
            about="items from a bag, the user's order aside",
        ),
    )
}


DEFAULT_MODEL = "sasrec"  # what `recserve train` trains unless told: the best of them (docs/quality.md)


def models_help() -> str:
    """--model's help: every model with what it is, and the default (its bracket escaped: the help is markup)."""
    described = [f"{name} ({entry.about})" for name, entry in MODELS.items()]
    return f"{', '.join(described[:-1])} or {described[-1]}. \\[default: {DEFAULT_MODEL}]"


def model_entry(name: str) -> ModelEntry:
    """The registry's entry of ``name``.

    Raises:
        DataError: no model of that name (the message lists the known ones).
    """
    if name not in MODELS:
        raise DataError(f"model {name!r}: expected one of {', '.join(MODELS)}")
    return MODELS[name]
