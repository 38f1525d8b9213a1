"""A run folder's record of what trained it (``run.json``): the model, its settings and its data (a
fingerprint, and the folder it was read from). Written by ``recserve train``; the stages after it (export's
quality check, ``recserve bench``, evaluation) read it here, and nothing finds a run's data another way.
"""

from __future__ import annotations

import json
from pathlib import Path

from recserve.constants import RUN_FILE

DATA_FOLDER = "folder"  # the key, under "data", of the folder the run read (not part of what a rerun must match)


def write_run_record(run_dir: Path, record: dict) -> None:
    (Path(run_dir) / RUN_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def read_run_record(run_dir: Path) -> dict | None:
    """The run's record, or None where the folder has none (a run of an older recserve, or no run)."""
    path = Path(run_dir) / RUN_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def data_folder_of(run_dir: Path) -> Path | None:
    """The data folder the run was trained on, where its record names one that is still there."""
    record = read_run_record(run_dir) or {}
    folder = record.get("data", {}).get(DATA_FOLDER)
    return Path(folder) if folder and Path(folder).is_dir() else None
