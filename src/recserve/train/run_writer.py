"""A run folder's own files: what trained it (``run.json``: model, settings, data; a rerun that disagrees is
refused with the differences named, before anything is written), the catalogue serving needs (copied from
the data folder) and ``metrics.json``."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import asdict
from pathlib import Path

from recserve.artifacts.catalogue import write_catalogue
from recserve.artifacts.popularity import write_popularity
from recserve.artifacts.run_record import DATA_FOLDER, read_run_record, write_run_record
from recserve.constants import ITEMS_FILE, METRICS_FILE, MODEL_CONFIG_FILE, RUN_FILE
from recserve.data.datasets import PreparedData
from recserve.errors import ConfigError, DataError

# Training settings a rerun may change: it continues the same run.
RESUMABLE = (
    "epochs",
    "patience",
    "patience_steps",
    "max_steps",
    "max_minutes",
    "device",
    "devices",
    "ddp_compress",
    "precision",
    "compile",
    "cuda_graphs",
    "resume",
    "refit",  # a step after training: a finished run rerun with it refits, without it keeps the validated weights
)
LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"
AFRESH = "start afresh with --overwrite, or choose another --out"

log = logging.getLogger(__name__)


def data_fingerprint(data: PreparedData) -> dict:
    """Counts and a digest of the sequences and item IDs: two folders with the same data agree."""
    digest = hashlib.blake2b(digest_size=16)
    for array in (data.sequences.items, data.sequences.offsets, data.vocab.ids.astype(str)):
        digest.update(array.tobytes())
    return {
        "users": int(data.sequences.num_users),
        "items": int(data.vocab.num_items),
        "interactions": int(len(data.sequences.items)),
        "digest": digest.hexdigest(),
    }


def trained_on(run_dir: Path, data: PreparedData, data_dir: Path) -> dict | None:
    """The run's ``run.json`` (None where the run has none), after checking that ``data`` is what it was
    trained on: a folder whose fingerprint differs is refused with the fields that differ named.

    Raises:
        DataError: the data folder is not the run's.
    """
    record = read_run_record(run_dir)
    if record is None:
        return None
    recorded, found = record.get("data", {}), data_fingerprint(data)
    differ = [
        f"{k} {recorded[k]} there, {found.get(k)} here"
        for k in recorded
        if k != DATA_FOLDER and recorded[k] != found.get(k)
    ]
    if differ:
        raise DataError(
            f"{data_dir}: not the data the run {run_dir} was trained on ({'; '.join(differ)}); "
            "evaluate on the data folder it was trained on"
        )
    return record


def data_check(record: dict | None, run_dir: Path) -> str:
    """What an evaluation report says of its data check: done, or not done for want of a ``run.json`` (a run
    of an older recserve), which is also logged as a warning: its figures may be of other data."""
    if record is not None:
        return "the data folder's fingerprint is the run's"
    log.warning(
        "%s has no run.json: the data folder cannot be checked to be the one it was trained on; the report "
        "says so (data_check)",
        run_dir,
    )
    return "unchecked: the run has no run.json (trained by an older recserve); its figures may be of other data"


def run_identity(model: str, model_cfg, cfg, data: PreparedData, data_dir: Path | None = None) -> dict:
    """What ``run.json`` records: a later run on the folder must agree on all of it but ``RESUMABLE`` and
    the data's folder (the same data moved is the same run)."""
    train = {k: v for k, v in asdict(cfg).items() if k not in RESUMABLE}
    data_record = data_fingerprint(data) | ({DATA_FOLDER: str(Path(data_dir).resolve())} if data_dir else {})
    return {"model": model, "model_config": asdict(model_cfg), "train": train, "data": data_record}


def prepare_run_folder(out_dir: Path, identity: dict, epochs: int, resume: bool, overwrite: bool) -> None:
    """Creates ``out_dir`` for this run, or checks that the run already there is this one.

    Raises:
        ConfigError: the folder holds a run with other settings or data, a run without ``run.json``, files
            that are no run (never deleted, even with ``overwrite``), or a run already past ``epochs``.
    """
    out_dir = Path(out_dir)
    if os.environ.get("LOCAL_RANK", "0") != "0":
        return  # a DDP worker: rank 0 has prepared the folder
    if out_dir.exists() and any(out_dir.iterdir()):
        is_run = any((out_dir / name).exists() for name in (RUN_FILE, MODEL_CONFIG_FILE, METRICS_FILE, "checkpoints"))
        if not is_run:
            raise ConfigError(f"--out {out_dir}: the folder holds files but no recserve run; choose another --out")
        if overwrite:
            shutil.rmtree(out_dir)
        else:
            _check_same_run(out_dir, identity, epochs, resume)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_run_record(out_dir, identity)


def _check_same_run(out_dir: Path, identity: dict, epochs: int, resume: bool) -> None:
    path = out_dir / RUN_FILE
    if not path.is_file():
        raise ConfigError(
            f"--out {out_dir}: holds a run without {RUN_FILE} (from an older recserve), so it cannot "
            f"be checked against these settings; {AFRESH}"
        )
    recorded, now = json.loads(path.read_text()), json.loads(json.dumps(identity))
    for record in (recorded, now):
        record.get("data", {}).pop(DATA_FOLDER, None)  # the same data, moved, is the same run
    for name in RESUMABLE:  # recorded by a recserve before it was resumable (the refit until 2026-12)
        recorded.get("train", {}).pop(name, None)
    differences = _differences(recorded, now)
    if differences:
        raise ConfigError(
            f"--out {out_dir}: holds a run with other settings or data ({'; '.join(differences)}); {AFRESH}"
        )
    done = trained_epochs(out_dir)
    if resume and done > epochs:
        raise ConfigError(
            f"--out {out_dir}: the run there has trained {done} epochs and --epochs {epochs} asks "
            f"for fewer; ask for more than {done} to continue it, or {AFRESH}"
        )


def trained_epochs(out_dir: Path) -> int:
    """Epochs the run's last checkpoint holds (0 without one)."""
    path = Path(out_dir) / LAST_CHECKPOINT
    if not path.is_file():
        return 0
    from recserve.models.run_loader import read_weights

    return int(read_weights(path, mmap=True).get("epoch", -1)) + 1


def _differences(recorded: dict, now: dict, prefix: str = "") -> list[str]:
    """``name: recorded -> now`` for every leaf that differs; a setting newer than the recorded run, off (false
    or 0), is the run as it was (an older run resumes after an upgrade)."""
    out = []
    for key in sorted(set(recorded) | set(now)):
        old, new = recorded.get(key), now.get(key)
        if key not in recorded and new in (False, 0):
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            out += _differences(old, new, f"{prefix}{key}.")
        elif old != new:
            out.append(f"{prefix}{key}: {old!r} in the run, {new!r} now")
    return out


def save_catalog(run_dir: Path, data: PreparedData) -> None:
    """Copies what serving needs from the data folder, so that a run folder stands alone."""
    write_catalogue(run_dir, data.vocab.ids)
    write_popularity(run_dir, data.popularity)
    shutil.copyfile(Path(data.info["folder"]) / ITEMS_FILE, run_dir / ITEMS_FILE)
