"""``recserve train``: BERT4Rec on a prepared data folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, handle_errors


@handle_errors
def train(
    data: Annotated[Path, typer.Option("--data", "-d", help="Folder written by `recserve data`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Run folder (a second run on it resumes).")],
    model: Annotated[str, typer.Option(help="Model to train: bert4rec.")] = "bert4rec",
    window: Annotated[int, typer.Option(help="Longest input, the mask token included.")] = 100,
    hidden: Annotated[int, typer.Option(help="Embedding and transformer width.")] = 64,
    layers: Annotated[int, typer.Option(help="Transformer blocks.")] = 2,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = 2,
    dropout: Annotated[float, typer.Option(help="Dropout rate.")] = 0.2,
    mask_prob: Annotated[float, typer.Option(help="Cloze masking probability.")] = 0.2,
    epochs: Annotated[int, typer.Option(help="Most epochs; early stopping may end sooner.")] = 60,
    batch_size: Annotated[int, typer.Option(help="Samples per step.")] = 128,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 1e-3,
    samples_per_user: Annotated[int, typer.Option(help="Windows drawn per user per epoch.")] = 4,
    patience: Annotated[int, typer.Option(help="Epochs without a better validation NDCG@10 before stopping.")] = 8,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    devices: Annotated[int, typer.Option(help="GPUs to use (DDP when more than one).")] = 1,
    evaluate: Annotated[bool, typer.Option(help="Evaluate on the test split afterwards.")] = True,
) -> None:
    """Train BERT4Rec (Cloze task) with validation NDCG@10 each epoch, early stopping and checkpoints."""
    from recserve.train.trainer import TrainConfig, write_metrics
    from recserve.train.trainer import train as run_training

    if model != "bert4rec":
        raise typer.BadParameter(f"{model!r}: expected bert4rec", param_hint="--model")
    cfg = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, samples_per_user=samples_per_user,
                      patience=patience, seed=seed, device=device, devices=devices)
    overrides = dict(window=window, hidden=hidden, layers=layers, heads=heads, dropout=dropout, mask_prob=mask_prob)
    summary = run_training(data, out, overrides, cfg)
    if not summary:
        return  # a DDP worker other than rank 0
    write_metrics(out, summary)
    console.print(f"best validation NDCG@10 {summary['valid']['ndcg@10']:.4f} (epoch {summary['best_epoch']}); "
                  f"run folder {out}")
    if evaluate:
        from recserve.cli.evaluate import show_and_save

        show_and_save(out, data, seed, "cuda" if cfg.accelerator == "gpu" else "cpu")
