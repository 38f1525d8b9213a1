"""Each item's training events in ``popularity.npy`` (int64, by vocabulary index: padding first, the mask
token last, both 0): written into every run beside the catalogue and copied into every export, where it is
the answer to a history of unknown items and the popularity baseline. Written and read only here; numpy only."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from recserve.constants import POPULARITY_FILE
from recserve.errors import ConfigError


def write_popularity(folder: Path, counts: np.ndarray) -> None:
    np.save(Path(folder) / POPULARITY_FILE, np.asarray(counts), allow_pickle=False)


def has_popularity(folder: Path) -> bool:
    return (Path(folder) / POPULARITY_FILE).is_file()


def read_popularity(folder: Path) -> np.ndarray:
    """The counts of a run or an export folder.

    Raises:
        ConfigError: a folder without them (no run or export of recserve's).
    """
    path = Path(folder) / POPULARITY_FILE
    if not path.is_file():
        raise ConfigError(f"{folder}: no {POPULARITY_FILE}; train a run with `recserve train`, or export one")
    return np.load(path, allow_pickle=False)
