"""The models' configs, without torch (so the command line can show their defaults): what every config
shares (the index space, 0 padding, items 1..N, N + 1 the mask token, and its file, ``model_config.json``,
which holds the model's name and the dataclass fields), and BERT4Rec's, SASRec's and Mult-VAE's fields."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, Self

from recserve.errors import ConfigError
from recserve.option_fields import option


class ModelConfig:
    """Mixed into a model's frozen config dataclass (which has ``num_items``); ``MODEL`` names the model,
    ``TITLE`` is its name in prose."""

    MODEL: ClassVar[str]
    TITLE: ClassVar[str]
    # what a config saved before a field existed meant by its absence (the model it describes had none)
    BEFORE_FIELDS: ClassVar[dict] = {}
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
    def from_settings(cls, settings: dict) -> Self:
        """The config of ``settings`` as ``artifacts.model_config.read_model_config`` reads them (``model`` aside)."""
        return cls(**(cls.BEFORE_FIELDS | {k: v for k, v in settings.items() if k != "model"}))


ITEM_ATTRIBUTES = True
ITEM_ATTRIBUTES_HELP = (
    "learn an item as its ID plus its attributes (the item table's, where it has any): an item no training "
    "event holds is then ranked by its attributes"
)
ID_DROPOUT = 0.0
ID_DROPOUT_HELP = (
    "with item attributes: the share of items that each training step scores by their attributes alone, as a "
    "new item is (DropoutNet's cold-start training)"
)
SPARSE_MEDIAN_LENGTH = 20  # training histories shorter than this at the median: sparse (Amazon-like) data
SPARSE_DROPOUT, DENSE_DROPOUT = 0.5, 0.2


def refuse(problems: list[str], model: str) -> None:
    """One ``ConfigError`` naming every problem of a ``model`` config; nothing where there are none."""
    if problems:
        raise ConfigError(f"bad {model} config: " + "; ".join(problems))


def transformer_problems(cfg) -> list[str]:
    """What is wrong with the settings every transformer config has (empty when nothing is)."""
    problems = []
    if cfg.num_items < 1:
        problems.append(f"num_items={cfg.num_items}: must be at least 1")
    if cfg.window < 2:
        problems.append(f"window={cfg.window}: must be at least 2 (one item and the mask or reserved token)")
    if cfg.hidden < 1 or cfg.heads < 1 or cfg.hidden % cfg.heads:
        problems.append(f"hidden={cfg.hidden}, heads={cfg.heads}: hidden must be a multiple of heads")
    if cfg.layers < 1:
        problems.append(f"layers={cfg.layers}: must be at least 1")
    if not 0 <= cfg.dropout < 1:
        problems.append(f"dropout={cfg.dropout}: must be in [0, 1)")
    return problems


@dataclass(frozen=True)
class Bert4RecConfig(ModelConfig):
    MODEL: ClassVar[str] = "bert4rec"
    TITLE: ClassVar[str] = "BERT4Rec"

    num_items: int  # N, the catalogue size; the vocabulary adds padding (0) and the mask token (N + 1)
    window: int = option(100, "longest input, mask (reserved) token included")
    hidden: int = option(64, "model width")
    # 1 block does best on ML-100K-sized data: docs/quality.md
    layers: int = option(1, "transformer blocks")
    heads: int = option(2, "attention heads (hidden must divide by them)")
    dropout: float = option(0.2, "dropout on embeddings, attention and feed-forward outputs")
    # the paper: 0.2 on MovieLens, 0.4 on Steam
    mask_prob: float = option(0.4, "Cloze masking probability")
    item_attributes: bool = option(ITEM_ATTRIBUTES, ITEM_ATTRIBUTES_HELP)
    id_dropout: float = option(ID_DROPOUT, ID_DROPOUT_HELP)
    attribute_columns: int = 0  # set from the item table by the trainer: the attributes learned
    attribute_rows: int = 0  # their table's rows (models.attribute_codes)

    def validate(self) -> None:
        problems = transformer_problems(self)
        if not 0 <= self.id_dropout < 1:
            problems.append(f"id_dropout={self.id_dropout}: must be in [0, 1)")
        if not 0 < self.mask_prob < 1:
            problems.append(f"mask_prob={self.mask_prob}: must be in (0, 1)")
        refuse(problems, self.TITLE)


@dataclass(frozen=True)
class SASRecConfig(ModelConfig):
    MODEL: ClassVar[str] = "sasrec"
    TITLE: ClassVar[str] = "SASRec"
    BEFORE_FIELDS: ClassVar[dict] = {"relative_positions": False}

    num_items: int  # N, the catalogue size; the vocabulary adds padding (0) and a reserved index (N + 1)
    # the serving graph builds window - 1 history items and the reserved token
    window: int = option(100, "longest input, mask (reserved) token included")
    hidden: int = option(64, "model width")
    layers: int = option(2, "transformer blocks")
    heads: int = option(1, "attention heads (hidden must divide by them)")
    # `recserve train` picks it from the data (dropout_for)
    dropout: float = option(
        DENSE_DROPOUT,
        "dropout on embeddings, attention and outputs",
        shown=f"{SPARSE_DROPOUT} where the median training history is under {SPARSE_MEDIAN_LENGTH} items, "
        f"else {DENSE_DROPOUT}",
    )
    # Transformer-XL's, T5's: with ema_epochs 1, 1.05x test NDCG@10 on video.txt and 1.06x on ML-100K
    # (docs/quality.md)
    relative_positions: bool = option(True, "a learned attention bias per head and query-key distance")
    attention_span: int = option(
        0, "each position attends only its last this many positions, itself included (local attention); 0: all"
    )
    ligr: bool = option(
        False, "LiGR blocks (eSASRec's): each residual branch gated by a sigmoid of its input, a SwiGLU feed-forward"
    )
    lru: bool = option(
        False,
        "a linear recurrent unit beside attention in each block (LRURec's sequence mixing): each position a "
        "learned, decaying sum of the items up to it",
    )
    item_attributes: bool = option(ITEM_ATTRIBUTES, ITEM_ATTRIBUTES_HELP)
    id_dropout: float = option(ID_DROPOUT, ID_DROPOUT_HELP)
    attribute_columns: int = 0  # set from the item table by the trainer: the attributes learned
    attribute_rows: int = 0  # their table's rows (models.attribute_codes)

    def validate(self) -> None:
        problems = transformer_problems(self)
        if not 0 <= self.id_dropout < 1:
            problems.append(f"id_dropout={self.id_dropout}: must be in [0, 1)")
        if self.attention_span < 0:
            problems.append(f"attention_span={self.attention_span}: must be 0 (every position) or more")
        refuse(problems, self.TITLE)


@dataclass(frozen=True)
class MultVAEConfig(ModelConfig):
    MODEL: ClassVar[str] = "multvae"
    TITLE: ClassVar[str] = "Mult-VAE"

    num_items: int  # N, the catalogue size
    hidden: int = option(600, "hidden layer")  # the paper's [I -> 600 -> 200 -> 600 -> I]
    latent: int = option(200, "latent dimensions")
    dropout: float = option(0.5, "dropout on the normalised input")
    anneal_cap: float = option(0.2, "the largest KL weight (it grows linearly, and stops at this)")
    # the paper's total_anneal_steps
    anneal_steps: int = option(2000, "optimizer steps for the KL weight to reach 1 (it stops at the cap)")
    window: int = option(1024, "most history items served (the most recent)")

    def validate(self) -> None:
        problems = []
        if self.num_items < 1:
            problems.append(f"num_items={self.num_items}: must be at least 1")
        for name in ("hidden", "latent", "anneal_steps"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)}: must be at least 1")
        if not 0 <= self.dropout < 1:
            problems.append(f"dropout={self.dropout}: must be in [0, 1)")
        if not 0 <= self.anneal_cap <= 1:
            problems.append(f"anneal_cap={self.anneal_cap}: must be in [0, 1]")
        if self.window < 2:
            problems.append(f"window={self.window}: must be at least 2")
        refuse(problems, self.TITLE)
