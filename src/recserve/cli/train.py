"""``recserve train``: BERT4Rec, SASRec or Mult-VAE on a prepared data folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, handle_errors
from recserve.models.model_configs import (
    DENSE_DROPOUT,
    SPARSE_DROPOUT,
    SPARSE_MEDIAN_LENGTH,
    Bert4RecConfig,
    MultVAEConfig,
    SASRecConfig,
)
from recserve.train.train_config import MODEL_DEFAULTS, TrainConfig

B, S, M = Bert4RecConfig, SASRecConfig, MultVAEConfig  # their defaults, in the options' help


def _per_model(name: str) -> str:
    """A training setting's default for each model, as the options' help shows it: "(bert4rec 60, ...)"."""
    values = [f"{model} {MODEL_DEFAULTS[model].get(name, getattr(TrainConfig, name))}" for model in MODEL_DEFAULTS]
    return "(" + ", ".join(values) + ")"


@handle_errors
def train(
    data: Annotated[Path, typer.Option("--data", "-d", help="Folder written by `recserve data`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Run folder (a second run on it resumes).")],
    model: Annotated[
        str,
        typer.Option(
            help="sasrec (causal, next item at every position; the default: it ranks best on every data set "
            "measured), bert4rec (bidirectional, Cloze task; the PoC's model) or multvae (items from a bag)."
        ),
    ] = "sasrec",
    window: Annotated[
        int | None,
        typer.Option(
            help=f"BERT4Rec, SASRec: longest input, mask (reserved) token included [{B.window}, {S.window}]. "
            f"Mult-VAE: most history items served [{M.window}]."
        ),
    ] = None,
    hidden: Annotated[
        int | None,
        typer.Option(
            help=f"BERT4Rec, SASRec: model width [{B.hidden}, {S.hidden}]. Mult-VAE: hidden layer [{M.hidden}]."
        ),
    ] = None,
    layers: Annotated[
        int | None, typer.Option(help=f"BERT4Rec, SASRec: transformer blocks [{B.layers}, {S.layers}].")
    ] = None,
    heads: Annotated[
        int | None, typer.Option(help=f"BERT4Rec, SASRec: attention heads [{B.heads}, {S.heads}].")
    ] = None,
    dropout: Annotated[
        float | None,
        typer.Option(
            help=f"Dropout rate [BERT4Rec {B.dropout}; SASRec {SPARSE_DROPOUT} where the median training history "
            f"is under {SPARSE_MEDIAN_LENGTH} items, else {DENSE_DROPOUT}; Mult-VAE {M.dropout} on the input]."
        ),
    ] = None,
    mask_prob: Annotated[
        float | None, typer.Option(help=f"BERT4Rec: Cloze masking probability [{B.mask_prob}].")
    ] = None,
    relative_positions: Annotated[
        bool | None,
        typer.Option(help="SASRec: a learned attention bias per head and query-key distance [on]."),
    ] = None,
    attention_span: Annotated[
        int | None,
        typer.Option(
            help="SASRec: each position attends only its last this many positions, itself included "
            "(local attention); 0: all [0]."
        ),
    ] = None,
    ema_epochs: Annotated[
        float | None,
        typer.Option(
            help="BERT4Rec, SASRec: validate and keep a moving average of the weights over about this many "
            f"epochs (an exponential one, updated every step); 0: off {_per_model('ema_epochs')}."
        ),
    ] = None,
    loss_exclude_seen: Annotated[
        bool,
        typer.Option(
            help="BERT4Rec: leave a sample's other items out of each "
            "softmax; SASRec: the items up to each position; as serving "
            "leaves seen items out."
        ),
    ] = TrainConfig.loss_exclude_seen,
    samples_per_user: Annotated[
        int | None,
        typer.Option(
            help=f"Windows drawn per user per epoch {_per_model('samples_per_user')}; a SASRec window "
            "predicts at every position."
        ),
    ] = None,
    loss: Annotated[
        str,
        typer.Option(
            help="BERT4Rec, SASRec: full (exact softmax over the catalogue), "
            "sampled-uniform or sampled-popularity (in-batch plus drawn negatives, "
            "log-Q corrected); auto: full up to 50,000 items, else sampled-uniform."
        ),
    ] = TrainConfig.loss,
    negatives: Annotated[
        int, typer.Option(help="Sampled losses: negatives drawn per batch, beside as many in-batch targets.")
    ] = TrainConfig.negatives,
    latent: Annotated[int | None, typer.Option(help=f"Mult-VAE: latent dimensions [{M.latent}].")] = None,
    anneal_cap: Annotated[float | None, typer.Option(help=f"Mult-VAE: the largest KL weight [{M.anneal_cap}].")] = None,
    anneal_steps: Annotated[
        int | None,
        typer.Option(
            help=f"Mult-VAE: optimizer steps for the KL weight to reach 1 (it stops at the cap) [{M.anneal_steps}]."
        ),
    ] = None,
    heldout_share: Annotated[
        float, typer.Option(help="Mult-VAE: share of users held out for validation, and for test.")
    ] = TrainConfig.heldout_share,
    epochs: Annotated[
        int | None, typer.Option(help=f"Most epochs; early stopping may end sooner {_per_model('epochs')}.")
    ] = None,
    batch_size: Annotated[int | None, typer.Option(help=f"Samples per step {_per_model('batch_size')}.")] = None,
    lr: Annotated[float | None, typer.Option(help=f"Learning rate {_per_model('lr')}.")] = None,
    lr_schedule: Annotated[
        str, typer.Option(help="constant, or cosine (5% warm-up, then down to 0 at --epochs).")
    ] = TrainConfig.lr_schedule,
    weight_decay: Annotated[float | None, typer.Option(help=f"Weight decay {_per_model('weight_decay')}.")] = None,
    patience: Annotated[
        int | None,
        typer.Option(help=f"Epochs without a better validation metric before stopping {_per_model('patience')}."),
    ] = None,
    refit: Annotated[
        bool,
        typer.Option(
            help="BERT4Rec, SASRec: then train again on every item but the test one, for "
            "the epoch count validation chose, and keep that model."
        ),
    ] = TrainConfig.refit,
    seed: Annotated[int, typer.Option(help="Random seed.")] = TrainConfig.seed,
    device: Annotated[str, typer.Option(help="auto, cpu or gpu (cuda is taken for gpu).")] = TrainConfig.device,
    devices: Annotated[
        int,
        typer.Option(
            help="GPUs (or CPU processes) to use; DDP when more than one. "
            "--batch-size is the whole step's, split between them: below about 1,000 rows a GPU each step is "
            "bound by launching its kernels, so give a second GPU a larger batch."
        ),
    ] = TrainConfig.devices,
    precision: Annotated[
        str, typer.Option(help="auto (bf16 autocast on CUDA, float32 on CPU), bf16 or 32.")
    ] = TrainConfig.precision,
    compile: Annotated[
        bool,
        typer.Option(
            "--compile",
            help="torch.compile the model and loss: fewer, fused kernels after tens of seconds of compiling "
            "(on an H200 the bare step ran 1.6x as fast at 1M items, batch 512; a whole epoch on video.txt at "
            "batch 128, where Lightning's per-step work dominates, 1.05x).",
        ),
    ] = TrainConfig.compile,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Delete the run already in --out and start afresh "
            "(without it a rerun must match the run's settings and data, and resumes).",
        ),
    ] = False,
    evaluate: Annotated[bool, typer.Option(help="Evaluate on the test split afterwards.")] = True,
) -> None:
    """Train a model with validation each epoch, early stopping, checkpoints and curves.

    SASRec (the default) trains on the next item at every position, BERT4Rec on the Cloze task; both
    validate NDCG@10 on each user's second-to-last item. Mult-VAE trains on held-out-user splits and
    validates NDCG@100 (the paper's protocol). Values in brackets are the defaults of the models named
    (BERT4Rec first), where they differ; in parentheses, each model's. A setting of another model than the
    chosen one is refused.
    """
    from recserve.devices import torch_device
    from recserve.train.run_writer import write_metrics
    from recserve.train.train_config import model_settings
    from recserve.train.trainer import train as run_training

    if model not in MODEL_DEFAULTS:
        raise typer.BadParameter(f"{model!r}: expected one of {', '.join(MODEL_DEFAULTS)}", param_hint="--model")
    given = dict(
        batch_size=batch_size,
        lr=lr,
        weight_decay=weight_decay,
        epochs=epochs,
        patience=patience,
        samples_per_user=samples_per_user,
        ema_epochs=ema_epochs,
    )
    settings = MODEL_DEFAULTS[model] | {k: v for k, v in given.items() if v is not None}
    cfg = TrainConfig(
        heldout_share=heldout_share,
        seed=seed,
        device=torch_device(device, allow_auto=True),
        devices=devices,
        lr_schedule=lr_schedule,
        loss_exclude_seen=loss_exclude_seen,
        refit=refit,
        loss=loss,
        negatives=negatives,
        precision=precision,
        compile=compile,
        **settings,
    )
    overrides = model_settings(
        model,
        dict(
            window=window,
            hidden=hidden,
            layers=layers,
            heads=heads,
            dropout=dropout,
            mask_prob=mask_prob,
            relative_positions=relative_positions,
            attention_span=attention_span,
            latent=latent,
            anneal_cap=anneal_cap,
            anneal_steps=anneal_steps,
        ),
    )
    summary = run_training(data, out, overrides, cfg, model=model, overwrite=overwrite)
    if not summary:
        return  # a DDP worker other than rank 0
    write_metrics(out, summary)
    metric, value = next(iter(summary["valid"].items()))
    console.print(f"best validation {metric.upper()} {value:.4f} (epoch {summary['best_epoch']}); run folder {out}")
    if evaluate:
        from recserve.cli.evaluate import show_and_save

        show_and_save(out, data, seed, torch_device(cfg.accelerator))
