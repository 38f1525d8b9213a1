"""``recserve runs``: training runs side by side: the settings in which they differ and their metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, handle_errors
from recserve.errors import ConfigError

METRICS = ("ndcg@10", "hr@10", "mrr")


def run_row(run: Path, protocol: str) -> dict:
    """One run's settings (its model's and its training's) and metrics, from its metrics.json and
    model_config.json.

    Raises:
        ConfigError: a folder that holds no finished run.
    """
    from recserve.artifacts.model_config import read_model_config
    from recserve.artifacts.run_metrics import read_metrics
    from recserve.errors import DataError

    try:
        metrics = read_metrics(run)
        model = read_model_config(run)
    except (OSError, ValueError, DataError) as err:
        raise ConfigError(f"{run}: no finished run there ({err}); `recserve train --out {run}` makes one") from err
    test = metrics.get("test", {}).get(protocol, {})
    popular = metrics.get("popularity", {}).get(protocol, {})
    train = metrics.get("train", {})
    settings = {k: v for k, v in model.items() if k != "num_items"} | {
        k: v for k, v in train.items() if k not in ("seconds", "precision_used", "resume", "device")
    }
    return {
        "run": str(run),
        "settings": settings,
        "valid": {k: v for k, v in metrics.get("valid", {}).items() if isinstance(v, float)},
        "test": {k: test[k] for k in METRICS if k in test},
        "popularity": {k: popular[k] for k in METRICS if k in popular},
        "best_epoch": metrics.get("best_epoch"),
        "train_s": train.get("seconds"),
        "data": metrics.get("data"),
    }


@handle_errors
def runs(
    folders: Annotated[list[Path], typer.Argument(help="Run folders written by `recserve train`.")],
    protocol: Annotated[
        str, typer.Option(help="The test protocol to show: full, served, full_no_exclusion, sampled.")
    ] = "full",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object a run instead of the table.")] = False,
) -> None:
    """Training runs side by side, a column each: the settings in which they differ, then test NDCG@10, HR@10
    and MRR under one protocol (beside popularity's), validation, best epoch and training time."""
    from rich.table import Table

    rows = [run_row(Path(folder), protocol) for folder in folders]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    names = sorted({k for row in rows for k in row["settings"]})
    differing = [k for k in names if len({json.dumps(row["settings"].get(k)) for row in rows}) > 1]
    table = Table(title=f"{len(rows)} runs side by side; test under the {protocol} protocol")
    table.add_column("")
    for row in rows:  # a column a run: settings and metrics read down it
        table.add_column(Path(row["run"]).name or row["run"], justify="right")

    def number(value, digits: int = 4) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    for name in differing:
        table.add_row(name, *(str(row["settings"].get(name, "-")) for row in rows))
    if differing:
        table.add_section()
    for metric in METRICS:
        table.add_row(f"test {metric}", *(number(row["test"].get(metric)) for row in rows))
    table.add_row("popularity ndcg@10", *(number(row["popularity"].get("ndcg@10")) for row in rows))
    table.add_row("valid", *(number(next(iter(row["valid"].values()), None)) for row in rows))
    table.add_row("best epoch", *(str(row["best_epoch"]) for row in rows))
    table.add_row("training s", *(number(row["train_s"], 0) for row in rows))
    console.print(table)
    if not differing and len(rows) > 1:
        console.print("the runs' settings are the same: they differ by their data or their seed only")
