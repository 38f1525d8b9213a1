"""``recserve evaluate``: test metrics of a run under the full and sampled protocols."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, handle_errors


def show_and_save(run: Path, data: Path, seed: int, device: str) -> dict:
    from rich.table import Table

    from recserve.models.runs import model_name
    from recserve.train.evaluate import evaluate_run
    from recserve.train.heldout import evaluate_heldout_run
    from recserve.train.trainer import write_metrics

    model = model_name(run)
    with console.status("ranking the test split"):
        if model == "multvae":
            result = evaluate_heldout_run(run, data, device=device)
        else:
            result = evaluate_run(run, data, seed=seed, device=device)
    write_metrics(run, result)
    split = "held-out test users, 80% of items fed" if model == "multvae" else "leave-one-out"
    table = Table(title=f"test split ({split}); all metrics in metrics.json")
    table.add_column("model")
    table.add_column("protocol")
    keys = (
        ["recall@20", "recall@50", "ndcg@100"]
        if model == "multvae"
        else ["hr@10", "ndcg@10", "hr@20", "ndcg@20", "mrr"]
    )
    for key in keys:
        table.add_column(key, justify="right")
    for who in ("test", "popularity"):
        for protocol, metrics in result[who].items():
            name = model if who == "test" else "popularity"
            table.add_row(name, protocol, *(f"{metrics[k]:.4f}" for k in keys))
    console.print(table)
    if model == "multvae":
        console.print(
            "heldout: every item ranked for each test user, the fed items excluded (the Mult-VAE paper's protocol)"
        )
    else:
        console.print(
            "full: every item ranked, seen items excluded (what serving does); sampled: against 100 "
            "popularity-drawn negatives; sampled_uniform: against 100 uniformly drawn unseen items"
        )
    return result


@handle_errors
def evaluate(
    run: Annotated[Path, typer.Option("--run", "-r", help="Run folder written by `recserve train`.")],
    data: Annotated[Path, typer.Option("--data", "-d", help="The data folder the run was trained on.")],
    seed: Annotated[int, typer.Option(help="Seed of the sampled protocol's negatives.")] = 0,
    device: Annotated[str, typer.Option(help="cpu or gpu (cuda is taken for gpu).")] = "cpu",
) -> None:
    """HR@1/5/10/20, NDCG@5/10/20 and MRR on the test split under every protocol, beside a popularity
    baseline; into metrics.json."""
    from recserve.devices import torch_device

    show_and_save(run, data, seed, torch_device(device))
