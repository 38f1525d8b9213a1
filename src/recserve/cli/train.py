"""``recserve train``: BERT4Rec, SASRec or Mult-VAE on a prepared data folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from recserve.cli.console import console, handle_errors
from recserve.cli.options import Settings, takes
from recserve.models.registry import DEFAULT_MODEL, MODELS, models_help
from recserve.train.train_config import MODEL_DEFAULTS, TrainConfig


def _per_model(name: str) -> str:
    """A training setting's default for each model, as the options' help shows it: "(bert4rec 60, ...)"."""
    values = [f"{model} {MODEL_DEFAULTS[model].get(name, getattr(TrainConfig, name))}" for model in MODEL_DEFAULTS]
    return "(" + ", ".join(values) + ")"


MODEL_OPTIONS = Settings(
    "model_options",
    tuple(entry.config for entry in MODELS.values()),
    build=False,
    unset=True,
    titles={entry.config: entry.config.TITLE for entry in MODELS.values()},
)
TRAIN_OPTIONS = Settings(
    "training", (TrainConfig,), build=False, unset=frozenset(set().union(*MODEL_DEFAULTS.values())), shown=_per_model
)


@handle_errors
@takes(MODEL_OPTIONS, TRAIN_OPTIONS)
def train(
    data: Annotated[Path, typer.Option("--data", "-d", help="Folder written by `recserve data`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Run folder (a second run on it resumes).")],
    model: Annotated[
        str | None,
        typer.Option(help=models_help()),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help='A TOML, YAML or JSON file of settings by their options\' names (model = "bert4rec", epochs = '
            "40, relative_positions = true, ...); an option given here overrides the file's.",
        ),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Delete the run already in --out and start afresh "
            "(without it a rerun must match the run's settings and data, and resumes).",
        ),
    ] = False,
    evaluate: Annotated[bool, typer.Option(help="Evaluate on the test split afterwards.")] = True,
    model_options: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
) -> None:
    """Train a model with validation each epoch, early stopping, checkpoints and curves.

    SASRec (the default) trains on the next item at every position, BERT4Rec on the Cloze task; both
    validate NDCG@10 on each user's second-to-last item. Mult-VAE trains on held-out-user splits and
    validates NDCG@100 (the paper's protocol). Values in brackets are the defaults of the models named
    (BERT4Rec first), where they differ; in parentheses, each model's. A setting of another model than the
    chosen one is refused.
    """
    from recserve.artifacts.run_metrics import merge_metrics
    from recserve.devices import torch_device
    from recserve.train.train_config import model_settings
    from recserve.train.trainer import train as run_training

    if config is not None:
        from recserve.cli.config_file import read_settings_file

        model_fields, train_fields = MODEL_OPTIONS.fields(), TRAIN_OPTIONS.fields()
        values = read_settings_file(config, model_fields | train_fields, {"model": str})
        model = model or values.pop("model", None)
        model_options = {k: v for k, v in values.items() if k in model_fields} | (model_options or {})
        training = {k: v for k, v in values.items() if k in train_fields} | (training or {})
    model = model or DEFAULT_MODEL
    if model not in MODEL_DEFAULTS:
        raise typer.BadParameter(f"{model!r}: expected one of {', '.join(MODEL_DEFAULTS)}", param_hint="--model")
    cfg, notes = TrainConfig.for_model(model, training or {})
    for note in notes:
        console.print(f"note: {note}")
    overrides = model_settings(model, model_options or {})
    summary = run_training(data, out, overrides, cfg, model=model, overwrite=overwrite)
    if not summary:
        return  # a DDP worker other than rank 0
    merge_metrics(out, summary, replaces=("refit",))
    metric, value = next(iter(summary["valid"].items()))
    console.print(f"best validation {metric.upper()} {value:.4f} (epoch {summary['best_epoch']}); run folder {out}")
    if evaluate:
        from recserve.cli.metrics_report import show_and_save

        show_and_save(out, data, cfg.seed, torch_device(cfg.accelerator))
