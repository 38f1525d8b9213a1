"""Which model a run folder holds, and loading it: ``model_config.json`` names the model."""

from __future__ import annotations

from pathlib import Path

import torch

from recserve.artifacts.model_config import read_model_config
from recserve.constants import MODEL_CONFIG_FILE, WEIGHTS_FILE
from recserve.errors import DataError
from recserve.models.bert4rec import Bert4Rec
from recserve.models.model_configs import Bert4RecConfig, MultVAEConfig, SASRecConfig
from recserve.models.multvae import MultVAE
from recserve.models.registry import MODELS, model_entry
from recserve.models.sasrec import SASRec


def model_name(run_dir: Path) -> str:
    """The model of a run folder (``bert4rec``, ``sasrec`` or ``multvae``)."""
    return _known_model(read_model_config(run_dir), run_dir)


def load_config(run_dir: Path) -> Bert4RecConfig | SASRecConfig | MultVAEConfig:
    settings = read_model_config(run_dir)  # read once: the model's name and its settings
    return model_entry(_known_model(settings, run_dir)).config.from_settings(settings)


def _known_model(settings: dict, run_dir: Path) -> str:
    if settings["model"] not in MODELS:
        raise DataError(f"{run_dir}: unknown model {settings['model']!r}; this recserve knows {', '.join(MODELS)}")
    return settings["model"]


def load_run(run_dir: Path, weights: str = WEIGHTS_FILE) -> Bert4Rec | SASRec | MultVAE:
    """The trained model of a run folder (``model_config.json`` and ``model.pt``, or the run's other weights
    file ``weights``: a refit's validated ones), in eval mode on the CPU."""
    run_dir = Path(run_dir)
    cfg = load_config(run_dir)
    if not (run_dir / weights).is_file():
        raise DataError(f"{run_dir}: not a training run, missing {weights}; run `recserve train` first")
    model = model_entry(cfg.MODEL).module_class()(cfg)
    try:
        model.load_state_dict(read_weights(run_dir / weights))
    except RuntimeError as err:  # another shape or other names than the run's model_config.json says
        raise DataError(
            f"{run_dir / weights}: not the weights of the model {MODEL_CONFIG_FILE} describes "
            f"({str(err).splitlines()[0][:200]}); train the run again"
        ) from None
    return model.eval()


def read_weights(path: Path, mmap: bool = False) -> dict:
    """A weights or checkpoint file as torch saved it (tensors and plain values only: ``weights_only``).

    Raises:
        DataError: a file torch cannot read as one (truncated, tampered with, or of another kind).
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # torch's unpickler raises many kinds, all meaning "not a file of weights"
        raise DataError(
            f"{path}: not a weights file recserve can read ({type(err).__name__}); it may be truncated or "
            "changed since it was written: train the run again"
        ) from None
    if not isinstance(state, dict):
        raise DataError(f"{path}: holds a {type(state).__name__}, not a model's weights; train the run again")
    return state
