"""A run's ``model_config.json`` as a file: which model a run holds and its settings (the model's own config
class, ``recserve.models.model_configs``, writes it and gives its fields their types). Read only here."""

from __future__ import annotations

import json
from pathlib import Path

from recserve.constants import EXPORT_MANIFEST, MODEL_CONFIG_FILE
from recserve.errors import DataError

LEGACY_MODEL = "bert4rec"  # the model of a config that names none (runs from before it was recorded)


def read_model_config(run_dir: Path) -> dict:
    """The run's model settings, ``model`` among them.

    Raises:
        DataError: an export, or a folder that is no run, each named with what to do.
    """
    path = Path(run_dir) / MODEL_CONFIG_FILE
    if not path.is_file():
        if (Path(run_dir) / EXPORT_MANIFEST).is_file():
            raise DataError(
                f"{run_dir}: an export, not a training run; serve it with `recserve repo --export {run_dir}`"
            )
        raise DataError(f"{run_dir}: not a training run, missing {MODEL_CONFIG_FILE}; run `recserve train` first")
    try:
        config = json.loads(path.read_text())
    except ValueError as err:
        raise DataError(f"{path}: not JSON ({err}); train the run again") from err
    if not isinstance(config, dict):
        raise DataError(f"{path}: not a model's settings; train the run again")
    return {"model": LEGACY_MODEL} | config
