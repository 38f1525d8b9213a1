"""The item catalogue that travels between stages: the sorted item IDs in ``item_ids.npy`` (the item with
``ids[i]`` has vocabulary index ``i + 1``), written into every run and copied into every export and model
repository. Its ID type ("int64" or "string") is the array's own, decided once when ``recserve data``
builds the vocabulary, and read from here by every stage. Written and read only here; numpy only (it is
read inside the Triton stub).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from recserve.constants import ITEM_TABLE_FILE
from recserve.errors import ConfigError

TRITON_DTYPES = {"int64": "INT64", "string": "BYTES"}  # the served item_ids' data type, by ID type


def id_type_of(ids: np.ndarray) -> str:
    """A catalogue's ID type, from its IDs' array: "string" for text, else "int64"."""
    return "string" if np.asarray(ids).dtype.kind in "OUS" else "int64"


def is_int64_text(text: str) -> bool:
    """Whether ``text`` reads as an integer ID (within int64): how an ID typed or sent as text is told apart."""
    try:
        return -(2**63) <= int(text) < 2**63
    except ValueError:
        return False


def write_catalogue(folder: Path, ids: np.ndarray) -> Path:
    """Writes the sorted item IDs into ``folder``; returns the file."""
    path = Path(folder) / ITEM_TABLE_FILE
    np.save(path, np.asarray(ids), allow_pickle=False)
    return path


def read_catalogue(folder: Path) -> np.ndarray:
    """The sorted item IDs of a run, export or repository folder.

    Raises:
        ConfigError: the folder holds no catalogue (naming the file), or one that cannot be read.
    """
    path = Path(folder) / ITEM_TABLE_FILE
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError as err:
        raise ConfigError(f"{folder}: no item catalogue ({ITEM_TABLE_FILE}); is it a run or an export?") from err
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: not a catalogue recserve can read ({err})") from err


def copy_catalogue(source: Path, target: Path) -> None:
    """The catalogue of ``source`` into the folder ``target`` (a repository's model, say), as it is."""
    shutil.copyfile(Path(source) / ITEM_TABLE_FILE, Path(target) / ITEM_TABLE_FILE)


def has_catalogue(folder: Path) -> bool:
    return (Path(folder) / ITEM_TABLE_FILE).is_file()
