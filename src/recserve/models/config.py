"""What every model config shares: the index space (0 padding, items 1..N, N + 1 the mask token) and its
file, ``model_config.json``, which holds the model's name and the dataclass fields."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import ClassVar, Self


class ModelConfig:
    """Mixed into a model's frozen config dataclass (which has ``num_items``); ``MODEL`` names the model."""

    MODEL: ClassVar[str]
    num_items: int

    @property
    def vocab_size(self) -> int:
        return self.num_items + 2

    @property
    def mask_index(self) -> int:
        """N + 1: BERT4Rec's mask token; Mult-VAE reserves it (the serving graph appends it; it is ignored)."""
        return self.num_items + 1

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps({"model": self.MODEL, **asdict(self)}, indent=2) + "\n")  # type: ignore[call-overload]

    @classmethod
    def load(cls, path: Path) -> Self:
        raw = json.loads(Path(path).read_text())
        raw.pop("model", None)
        return cls(**raw)
