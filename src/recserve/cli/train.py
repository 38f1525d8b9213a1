"""``recserve train``: BERT4Rec, SASRec or Mult-VAE on a prepared data folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, handle_errors


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
            help="BERT4Rec, SASRec: longest input, mask (reserved) token "
            "included [100]. Mult-VAE: most history items served [1024]."
        ),
    ] = None,
    hidden: Annotated[
        int | None, typer.Option(help="BERT4Rec, SASRec: model width [64]. Mult-VAE: hidden layer [600].")
    ] = None,
    layers: Annotated[int | None, typer.Option(help="BERT4Rec, SASRec: transformer blocks [1, 2].")] = None,
    heads: Annotated[int | None, typer.Option(help="BERT4Rec, SASRec: attention heads [2, 1].")] = None,
    dropout: Annotated[
        float | None,
        typer.Option(
            help="Dropout rate [BERT4Rec 0.2; SASRec 0.5 where the median "
            "training history is under 20 items, else 0.2; Mult-VAE 0.5 "
            "on the input]."
        ),
    ] = None,
    mask_prob: Annotated[float, typer.Option(help="BERT4Rec: Cloze masking probability.")] = 0.4,
    loss_exclude_seen: Annotated[
        bool,
        typer.Option(
            help="BERT4Rec: leave a sample's other items out of each "
            "softmax; SASRec: the items up to each position; as serving "
            "leaves seen items out."
        ),
    ] = True,
    samples_per_user: Annotated[
        int | None,
        typer.Option(
            help="BERT4Rec, SASRec: windows drawn per user per "
            "epoch [4, 2]; a SASRec window predicts at every "
            "position."
        ),
    ] = None,
    loss: Annotated[
        str,
        typer.Option(
            help="BERT4Rec, SASRec: full (exact softmax over the catalogue), "
            "sampled-uniform or sampled-popularity (in-batch plus drawn negatives, "
            "log-Q corrected); auto: full up to 50,000 items, else sampled-uniform."
        ),
    ] = "auto",
    negatives: Annotated[
        int, typer.Option(help="Sampled losses: negatives drawn per batch, beside as many in-batch targets.")
    ] = 8192,
    latent: Annotated[int, typer.Option(help="Mult-VAE: latent dimensions.")] = 200,
    anneal_cap: Annotated[float, typer.Option(help="Mult-VAE: the largest KL weight.")] = 0.2,
    anneal_steps: Annotated[
        int, typer.Option(help="Mult-VAE: optimizer steps for the KL weight to reach 1 (it stops at the cap).")
    ] = 2000,
    heldout_share: Annotated[
        float, typer.Option(help="Mult-VAE: share of users held out for validation, and for test.")
    ] = 0.1,
    epochs: Annotated[
        int | None, typer.Option(help="Most epochs; early stopping may end sooner [60, 100, 200].")
    ] = None,
    batch_size: Annotated[int | None, typer.Option(help="Samples per step [128, 100].")] = None,
    lr: Annotated[float | None, typer.Option(help="Learning rate [1e-3].")] = None,
    lr_schedule: Annotated[
        str, typer.Option(help="constant, or cosine (5% warm-up, then down to 0 at --epochs).")
    ] = "constant",
    weight_decay: Annotated[float | None, typer.Option(help="Weight decay [0.01, 0].")] = None,
    patience: Annotated[
        int | None, typer.Option(help="Epochs without a better validation metric before stopping [8, 20].")
    ] = None,
    refit: Annotated[
        bool,
        typer.Option(
            help="BERT4Rec, SASRec: then train again on every item but the test one, for "
            "the epoch count validation chose, and keep that model."
        ),
    ] = False,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    devices: Annotated[
        int,
        typer.Option(
            help="GPUs (or CPU processes) to use; DDP when more than one. "
            "--batch-size is the whole step's, split between them: below about 1,000 rows a GPU each step is "
            "bound by launching its kernels, so give a second GPU a larger batch."
        ),
    ] = 1,
    precision: Annotated[str, typer.Option(help="auto (bf16 autocast on CUDA, float32 on CPU), bf16 or 32.")] = "auto",
    compile: Annotated[
        bool,
        typer.Option(
            "--compile",
            help="torch.compile the model and loss: fewer, fused kernels after tens of seconds of compiling "
            "(on an H200 the bare step ran 1.6x as fast at 1M items, batch 512; a whole epoch on video.txt at "
            "batch 128, where Lightning's per-step work dominates, 1.05x).",
        ),
    ] = False,
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
    (BERT4Rec first), where they differ.
    """
    from recserve.train.config import MODEL_DEFAULTS, TrainConfig
    from recserve.train.trainer import train as run_training
    from recserve.train.trainer import write_metrics

    if model not in MODEL_DEFAULTS:
        raise typer.BadParameter(f"{model!r}: expected one of {', '.join(MODEL_DEFAULTS)}", param_hint="--model")
    given = dict(
        batch_size=batch_size,
        lr=lr,
        weight_decay=weight_decay,
        epochs=epochs,
        patience=patience,
        samples_per_user=samples_per_user,
    )
    settings = MODEL_DEFAULTS[model] | {k: v for k, v in given.items() if v is not None}
    cfg = TrainConfig(
        heldout_share=heldout_share,
        seed=seed,
        device=device,
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
    if model == "bert4rec":
        overrides = dict(mask_prob=mask_prob)
    elif model == "multvae":
        overrides = dict(latent=latent, anneal_cap=anneal_cap, anneal_steps=anneal_steps)
    else:
        overrides = {}
    given = dict(window=window, hidden=hidden, dropout=dropout)
    if model != "multvae":
        given |= dict(layers=layers, heads=heads)
    overrides |= {k: v for k, v in given.items() if v is not None}
    summary = run_training(data, out, overrides, cfg, model=model, overwrite=overwrite)
    if not summary:
        return  # a DDP worker other than rank 0
    write_metrics(out, summary)
    metric, value = next(iter(summary["valid"].items()))
    console.print(f"best validation {metric.upper()} {value:.4f} (epoch {summary['best_epoch']}); run folder {out}")
    if evaluate:
        from recserve.cli.evaluate import show_and_save

        show_and_save(out, data, seed, "cuda" if cfg.accelerator == "gpu" else "cpu")
