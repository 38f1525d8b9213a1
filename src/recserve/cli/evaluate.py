"""``recserve evaluate``: test metrics of a run under the full and sampled protocols."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import handle_errors
from recserve.cli.metrics_report import show_and_save


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
