"""``recserve train``: SASRec, BERT4Rec or Mult-VAE on PyTorch Lightning (checkpoints, early stopping, DDP)."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import cast

import torch

from recserve.constants import MODEL_CONFIG_FILE, VALIDATED_WEIGHTS_FILE, WEIGHTS_FILE
from recserve.data.datasets import PreparedData, load_prepared
from recserve.errors import ConfigError
from recserve.models.registry import DEFAULT_MODEL, model_entry
from recserve.train.curves import plot_curves
from recserve.train.run_writer import LAST_CHECKPOINT, prepare_run_folder, run_identity, save_catalog
from recserve.train.train_config import TrainConfig

log = logging.getLogger(__name__)

CURVES_FILE = "curves.png"


def train(
    data_dir: Path,
    out_dir: Path,
    model_overrides: dict | None = None,
    cfg: TrainConfig | None = None,
    model: str = DEFAULT_MODEL,
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

    from recserve.train.epoch_meter import EpochMeter
    from recserve.train.lightning_modules import build_task

    cfg = cfg or TrainConfig()
    cfg.validate()
    _quiet_lightning()
    data = load_prepared(data_dir)
    L = _seeded_lightning(cfg.seed)
    task = build_task(model, data, model_overrides or {}, cfg)
    carried = _warm_started(task, model, data, cfg)  # before the run folder is written: a refusal changes nothing
    out_dir = Path(out_dir)
    identity = run_identity(model, task.model_cfg, cfg, data, data_dir)
    prepare_run_folder(out_dir, identity, cfg.epochs, cfg.resume, overwrite)
    task.model_cfg.save(out_dir / MODEL_CONFIG_FILE)
    save_catalog(out_dir, data)
    # the folder is this run's (its record checked above): its checkpoints are overwritten, never versioned
    # (Lightning writes last-v1.ckpt beside a last.ckpt it did not write itself: a run folder moved or copied)
    best = ModelCheckpoint(
        dirpath=out_dir / "checkpoints",
        filename="best",
        monitor=task.monitor,
        mode="max",
        save_last=True,
        enable_version_counter=False,
    )
    # the caller's meter where it passes one (benchmarks/train_scale.py reads every epoch's), else one of its own
    given = next((c for c in callbacks or [] if isinstance(c, EpochMeter)), None)
    meter = given or EpochMeter()
    steps_per_epoch = _steps_per_epoch(task, cfg)
    patience = cfg.patience_epochs(steps_per_epoch)
    trainer = L.Trainer(
        max_epochs=cfg.epochs,
        max_steps=cfg.max_steps or -1,
        max_time={"seconds": cfg.max_minutes * 60} if cfg.max_minutes > 0 else None,
        accelerator=cfg.accelerator,
        devices=cfg.devices,
        strategy=cfg.strategy(),
        precision=cfg.lightning_precision,
        callbacks=[
            best,
            _epochs_from_one(),
            EarlyStopping(task.monitor, mode="max", patience=patience),
            *_averaging(cfg, model, steps_per_epoch),
            *(callbacks or []),
            *([] if given else [meter]),
        ],
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
    if not best.best_model_path:  # only a time budget ends training before its first validation
        raise ConfigError(
            f"--max-minutes {cfg.max_minutes:g} ended training before its first validation: give it more minutes "
            "(the run resumes from its last checkpoint)"
        )
    state = torch.load(best.best_model_path, map_location="cpu", weights_only=True)["state_dict"]
    weights = {k.removeprefix("model."): v for k, v in state.items()}
    best_epoch = _best_epoch(best.best_model_path)
    summary = {
        "model": model,
        "data": str(data_dir),
        "best_epoch": best_epoch,
        "budget_ended": (bool(cfg.max_minutes) and time.perf_counter() - started >= cfg.max_minutes * 60)
        or (bool(cfg.max_steps) and trainer.global_step >= cfg.max_steps),
        "steps": {
            "per_epoch": steps_per_epoch,
            "trained": int(trainer.global_step),
            "patience_epochs": patience,
            "cuda_graph": _graph_record(task.module),
        },
        "speed": meter.summary(),
        "valid": {task.monitor.removeprefix("val_"): float(best.best_model_score or 0.0)} | task.protocol,
        "train": asdict(cfg)
        | {"precision_used": cfg.lightning_precision, "seconds": round(time.perf_counter() - started, 1)},
    }
    if model_entry(model).sequential:
        summary["loss"] = task.module.loss_settings.describe()  # type: ignore[operator, union-attr]
    if carried is not None:
        summary["warm_start"] = carried
    if cfg.refit:  # the validated weights stay beside the refit, so that the test can say what the refit bought
        torch.save(weights, out_dir / VALIDATED_WEIGHTS_FILE)
        epochs, refit_started = (best_epoch or 0) + 1, time.perf_counter()
        weights = _refit(model, data, model_overrides or {}, cfg, epochs)
        summary["refit"] = {
            "epochs": epochs,
            "seconds": round(time.perf_counter() - refit_started, 1),  # beside train.seconds, which it follows
            "trained_on": "items[:-1] (the validation item included)",
            "validated_weights": VALIDATED_WEIGHTS_FILE,
        }
    else:  # a refit run rerun without it: model.pt becomes the validated weights, the file beside it goes
        (out_dir / VALIDATED_WEIGHTS_FILE).unlink(missing_ok=True)
    torch.save(weights, out_dir / WEIGHTS_FILE)
    plot_curves(out_dir / "logs" / "version_0" / "metrics.csv", out_dir / CURVES_FILE)
    return summary


def _graph_record(module) -> dict | None:
    """How a graphed module's steps ran (``train.graph_step``): replays of the captured step, eager steps (the
    warm-up and each epoch's shorter last batch) and whether the capture failed; None where nothing is graphed."""
    graph = getattr(module, "graph_step", None)
    if graph is None:
        return None
    return {"replayed": graph.replays, "eager": graph.eager_steps, "capture_failed": graph.failed}


def _epochs_from_one(label: str = "Epoch"):
    """Lightning's rich progress bar, its epochs counted from 1 as --epochs, curves.png and metrics.json count
    them ("Epoch 2/2", where Lightning says "Epoch 1/1"; the refit's "Refit epoch 2/7"); where the output is no
    terminal (a CI log, `make demo | tee`), where a bar draws nothing, a line an epoch instead."""
    from lightning.pytorch.callbacks import RichProgressBar

    if not sys.stderr.isatty():
        return _epoch_lines(label)

    class EpochsFromOne(RichProgressBar):
        def _get_train_description(self, current_epoch: int) -> str:
            total = f"/{self.trainer.max_epochs}" if self.trainer.max_epochs is not None else ""
            return f"{f'{label} {current_epoch + 1}{total}':{len(self.validation_description)}}"

    return EpochsFromOne()


def _epoch_lines(label: str):
    """A progress display of a line an epoch (``_epochs_from_one``'s where the output is no terminal): after
    its validation, or after its training where it has none (the refit)."""
    from lightning.pytorch.callbacks import ProgressBar

    class EpochLines(ProgressBar):
        """One line an epoch on stderr: the epoch counted from 1, the validation metric and the time."""

        def __init__(self):
            super().__init__()
            self.started = time.perf_counter()
            self.enabled = True

        def disable(self) -> None:
            self.enabled = False

        def on_validation_epoch_end(self, trainer, pl_module) -> None:
            if not self.enabled or trainer.sanity_checking or not trainer.is_global_zero:
                return  # one line an epoch, from the first process where several train
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val_")}
            self.line(trainer, ", ".join(f"{k.removeprefix('val_')} {v:.4f}" for k, v in metrics.items()))

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            if self.enabled and not trainer.limit_val_batches and trainer.is_global_zero:
                self.line(trainer, "trained")

        def line(self, trainer, shown: str) -> None:
            total = f"/{trainer.max_epochs}" if trainer.max_epochs is not None else ""
            elapsed = time.perf_counter() - self.started
            sys.stderr.write(f"{label} {trainer.current_epoch + 1}{total}: {shown or 'validated'} ({elapsed:.0f} s)\n")
            sys.stderr.flush()

    return EpochLines()


EMA_EVERY = 10  # steps between updates of the weights' average, where an epoch has 80 or more


def _averaging(cfg: TrainConfig, model: str, steps_per_epoch: int) -> list:
    """Lightning's exponential moving average of the weights, where asked: validation, checkpoints and the
    kept model use the average (training goes on from the current weights). Its decay a step makes the
    average's horizon ``ema_epochs`` epochs, whatever the batch size and the data's size."""
    cfg.check_model(model)
    if not cfg.ema_epochs:
        return []
    from lightning.pytorch.callbacks import EMAWeightAveraging

    # each update reads its count back from the GPU, a sync that starves a launch-bound step (1M items with
    # relative positions and an update every step: 0.68x the windows/s of neither); so every EMA_EVERY steps
    every = max(1, min(EMA_EVERY, steps_per_epoch // 8))
    decay = max(0.0, 1.0 - every / max(cfg.ema_epochs * steps_per_epoch, 1.0))
    return [EMAWeightAveraging(decay=decay, update_every_n_steps=every)]


def _steps_per_epoch(task, cfg: TrainConfig) -> int:
    """Optimizer steps an epoch of a sequence model: its training users' windows over the batch size."""
    train_seq = getattr(task.module, "train_seq", None)
    windows = int((train_seq.lengths > 0).sum()) * cfg.samples_per_user if train_seq is not None else 0
    return max(1, -(-windows // cfg.batch_size))


def _seeded_lightning(seed: int):
    import lightning as L

    L.seed_everything(seed, workers=True, verbose=False)
    return L


def _warm_started(task, model: str, data: PreparedData, cfg: TrainConfig) -> dict | None:
    """``task``'s model given the weights of ``--warm-start``'s run by item ID (what was carried), or None
    without one."""
    if not cfg.warm_start:
        return None
    from recserve.train.warm_start import carry_by_id

    module = cast(torch.nn.Module, task.module.model)
    return carry_by_id(module, task.model_cfg, model, data.vocab.ids, Path(cfg.warm_start))


def _refit(model: str, data: PreparedData, overrides: dict, cfg: TrainConfig, epochs: int) -> dict:
    """Trains a model again on every item but the test one, for the epoch count that validation chose, from
    where the run started (fresh, or ``--warm-start``'s weights), with the weights' average where the run had
    one (the epoch count was chosen on averaged weights): the average is what training ends with and what is
    kept."""
    from recserve.train.lightning_modules import build_task

    L = _seeded_lightning(cfg.seed)
    task = build_task(model, data, overrides, cfg, refit=True)
    _warm_started(task, model, data, cfg)
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator=cfg.accelerator,
        devices=1,
        logger=False,
        precision=cfg.lightning_precision,
        callbacks=[_epochs_from_one("Refit epoch"), *_averaging(cfg, model, _steps_per_epoch(task, cfg))],
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
        ".*training_step. returned .None.*",  # a graphed step: its backward and update are the graph's
        ".*AccumulateGrad node's stream does not match.*",
    ):  # DDP keeps the graph's nodes alive
        warnings.filterwarnings("ignore", message=message)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)


def _best_epoch(path: str) -> int | None:
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True)["epoch"])
    except (KeyError, OSError):
        return None
