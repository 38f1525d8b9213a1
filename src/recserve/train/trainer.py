"""``recserve train``: SASRec, BERT4Rec or Mult-VAE on PyTorch Lightning (checkpoints, early stopping, DDP)."""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from recserve.constants import (
    ITEM_TABLE_FILE,
    ITEMS_FILE,
    METRICS_FILE,
    MODEL_CONFIG_FILE,
    POPULARITY_FILE,
    WEIGHTS_FILE,
)
from recserve.data.datasets import PreparedData, load_prepared
from recserve.errors import ConfigError
from recserve.train.config import TrainConfig
from recserve.train.runfolder import LAST_CHECKPOINT, prepare_run_folder, run_identity

log = logging.getLogger(__name__)

CURVES_FILE = "curves.png"


def train(
    data_dir: Path,
    out_dir: Path,
    model_overrides: dict | None = None,
    cfg: TrainConfig | None = None,
    model: str = "bert4rec",
    overwrite: bool = False,
    callbacks: list | None = None,
) -> dict:
    """Trains ``model`` (bert4rec, sasrec or multvae) on a prepared folder and writes the run folder.

    The run holds ``run.json`` (what trained it), ``model.pt`` (the best weights), ``model_config.json``,
    ``checkpoints/`` (Lightning's best and last checkpoints; a second run on the same folder with the same
    settings resumes from the last), ``logs/`` and ``curves.png``.

    Args:
        overwrite: delete the run already in ``out_dir`` first (never a folder that holds no run).
        callbacks: more Lightning callbacks (benchmarks/train_scale.py times epochs with one).
    """
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from recserve.train.tasks import build_task

    cfg = cfg or TrainConfig()
    cfg.validate()
    if cfg.refit and model == "multvae":
        raise ConfigError(
            "refit: only BERT4Rec and SASRec can be refitted; Mult-VAE's held-out users are its validation"
        )
    _quiet_lightning()
    data = load_prepared(data_dir)
    L = _seeded_lightning(cfg.seed)
    task = build_task(model, data, model_overrides or {}, cfg)
    out_dir = Path(out_dir)
    prepare_run_folder(out_dir, run_identity(model, task.model_cfg, cfg, data), cfg.epochs, cfg.resume, overwrite)
    task.model_cfg.save(out_dir / MODEL_CONFIG_FILE)
    save_catalog(out_dir, data)
    best = ModelCheckpoint(
        dirpath=out_dir / "checkpoints", filename="best", monitor=task.monitor, mode="max", save_last=True
    )
    trainer = L.Trainer(
        max_epochs=cfg.epochs,
        accelerator=cfg.accelerator,
        devices=cfg.devices,
        strategy=cfg.strategy(),
        precision=cfg.lightning_precision,
        callbacks=[best, EarlyStopping(task.monitor, mode="max", patience=cfg.patience), *(callbacks or [])],
        logger=CSVLogger(out_dir, name="logs", version=0),
        deterministic=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=10,
    )
    last = out_dir / LAST_CHECKPOINT
    started = time.perf_counter()
    trainer.fit(task.module, ckpt_path=last if cfg.resume and last.exists() else None)
    if trainer.global_rank != 0:
        return {}
    state = torch.load(best.best_model_path, map_location="cpu", weights_only=True)["state_dict"]
    weights = {k.removeprefix("model."): v for k, v in state.items()}
    best_epoch = _best_epoch(best.best_model_path)
    summary = {
        "model": model,
        "data": str(data_dir),
        "best_epoch": best_epoch,
        "valid": {task.monitor.removeprefix("val_"): float(best.best_model_score or 0.0)} | task.protocol,
        "train": asdict(cfg)
        | {"precision_used": cfg.lightning_precision, "seconds": round(time.perf_counter() - started, 1)},
    }
    if model != "multvae":
        summary["loss"] = task.module.loss_settings.describe()  # type: ignore[operator, union-attr]
    if cfg.refit:
        epochs = (best_epoch or 0) + 1
        weights = _refit(model, data, model_overrides or {}, cfg, epochs)
        summary["refit"] = {"epochs": epochs, "trained_on": "items[:-1] (the validation item included)"}
    torch.save(weights, out_dir / WEIGHTS_FILE)
    _plot_curves(out_dir / "logs" / "version_0" / "metrics.csv", out_dir / CURVES_FILE)
    return summary


def _seeded_lightning(seed: int):
    import lightning as L

    L.seed_everything(seed, workers=True, verbose=False)
    return L


def _refit(model: str, data: PreparedData, overrides: dict, cfg: TrainConfig, epochs: int) -> dict:
    """Trains a fresh model on every item but the test one, for the epoch count that validation chose."""
    from recserve.train.tasks import build_task

    L = _seeded_lightning(cfg.seed)
    task = build_task(model, data, overrides, cfg, refit=True)
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator=cfg.accelerator,
        devices=1,
        logger=False,
        precision=cfg.lightning_precision,
        enable_checkpointing=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_model_summary=False,
    )
    trainer.fit(task.module)
    return task.module.model.state_dict()  # type: ignore[union-attr]


def _quiet_lightning() -> None:
    """Hides Lightning's advice that does not apply here (our batches are built per epoch, not by workers)."""
    import warnings

    for message in (
        ".*IterableDataset.*__len__.*",
        ".*LeafSpec.*",
        ".*smaller than the logging interval.*",
        ".*does not have many workers.*",
        ".*sync_dist=True.*",  # every logged metric is reduced over the ranks before it is logged
        ".*AccumulateGrad node's stream does not match.*",
    ):  # DDP keeps the graph's nodes alive
        warnings.filterwarnings("ignore", message=message)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)


def save_catalog(run_dir: Path, data: PreparedData) -> None:
    """Copies what serving needs from the data folder, so that a run folder stands alone."""
    np.save(run_dir / ITEM_TABLE_FILE, data.vocab.ids, allow_pickle=False)
    np.save(run_dir / POPULARITY_FILE, data.popularity, allow_pickle=False)
    shutil.copyfile(Path(data.info["folder"]) / ITEMS_FILE, run_dir / ITEMS_FILE)


def _best_epoch(path: str) -> int | None:
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True)["epoch"])
    except (KeyError, OSError):
        return None


def write_metrics(run_dir: Path, update: dict) -> dict:
    """Merges ``update`` into the run's metrics.json and returns the whole file."""
    path = Path(run_dir) / METRICS_FILE
    metrics = json.loads(path.read_text()) if path.exists() else {}
    metrics |= update
    path.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return metrics


def curves(csv_path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each logged metric (``train_loss``, ``val_*``) per epoch from Lightning's CSV log: name -> (epochs
    counted from 1, values); empty when there is no log."""
    import polars as pl

    if not csv_path.exists():
        return {}
    frame = pl.read_csv(csv_path, infer_schema_length=None)
    out = {}
    for column in sorted(c for c in frame.columns if c == "train_loss" or c.startswith("val_")):
        rows = frame.filter(pl.col(column).is_not_null())
        out[column] = (rows["epoch"].to_numpy() + 1, rows[column].to_numpy())
    return out


def _plot_curves(csv_path: Path, png_path: Path) -> None:
    """Training loss and the validation metrics per epoch, from Lightning's CSV log."""
    try:
        import matplotlib
    except ImportError:
        log.warning("no %s: matplotlib is not installed (pip install 'recserve[train]')", png_path.name)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = curves(csv_path)
    if not series:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    if "train_loss" in series:
        ax1.plot(*series.pop("train_loss"), marker="o")
    ax1.set(title="training loss", xlabel="epoch", ylabel="loss")
    for column, (epochs, values) in series.items():
        ax2.plot(epochs, values, marker="o", label=column.removeprefix("val_"))
    if series:
        ax2.legend()
    ax2.set(title="validation (full ranking, seen items excluded)", xlabel="epoch")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
