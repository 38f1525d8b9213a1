"""``recserve bench``: perf_analyzer sweeps over layouts and load levels, with a report and plots."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recserve.artifacts.served import LAYOUTS
from recserve.bench.load_settings import LoadSettings
from recserve.cli.console import console, handle_errors
from recserve.cli.options import Settings, takes
from recserve.errors import ServingError


def _numbers(text: str | None, name: str) -> list[float]:
    if not text:
        return []
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise typer.BadParameter(f"{text!r}: expected comma-separated numbers", param_hint=name) from err


def _data_of(repo: Path | None) -> Path | None:
    """The data folder behind a repository (repository -> run -> its run.json)."""
    from recserve.artifacts.repository_record import read_repository_info

    if repo is None or not repo.is_dir() or "run" not in (info := read_repository_info(repo)):
        return None
    from recserve.artifacts.run_record import data_folder_of

    return data_folder_of(Path(info["run"]))


@handle_errors
@takes(Settings("load", (LoadSettings,)))
def bench(
    out: Annotated[Path, typer.Option("--out", "-o", help="Report folder: summary.json, report.md, PNGs.")],
    repo: Annotated[Path | None, typer.Option(help="Repository to serve for the run (free loopback ports).")] = None,
    url: Annotated[str | None, typer.Option(help="A running server: host:http,host:grpc,host:metrics.")] = None,
    layouts: Annotated[
        str | None,
        typer.Option(
            help=f"Comma-separated layouts to load, of {', '.join(LAYOUTS)} (by session: their sessions loaded "
            "into the repository's store first) (default: every layout the repository holds; fused,seed,echo with "
            "--url)."
        ),
    ] = None,
    concurrency: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated concurrency levels. A level given again is run again (1,1,1: three rounds, each "
            "every --rules variant in turn); the rules' cost at it is then the median over the rounds."
        ),
    ] = "1,4,16,64",
    request_rate: Annotated[str | None, typer.Option(help="Comma-separated request rates (instead).")] = None,
    data: Annotated[
        Path | None, typer.Option(help="Data folder whose histories make the load (default: the repository's run's).")
    ] = None,
    load: LoadSettings = LoadSettings(),
) -> None:
    """Load-test layouts side by side with perf_analyzer: throughput, p50/p90/p99, per-step server time."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from recserve.bench.perf_analyzer import LoadLevel
    from recserve.bench.sweep import real_histories, sweep

    levels = [LoadLevel("request_rate", v) for v in _numbers(request_rate, "--request-rate")] or [
        LoadLevel("concurrency", v) for v in _numbers(concurrency, "--concurrency")
    ]
    if not levels:
        raise typer.BadParameter("give --concurrency or --request-rate levels")
    if repo is not None and not repo.is_dir():
        raise ServingError(f"{repo}: no such model repository; write one with `recserve repo`")
    data = data or _data_of(repo)
    if layouts is None:
        from recserve.artifacts.repository_record import read_repository_info

        held = read_repository_info(repo)["layouts"] if repo is not None else {}
        layouts = ",".join(x for x in LAYOUTS if x in held) or "fused,seed,echo"
    if data is None:
        raise typer.BadParameter("no data folder known for the load's histories; pass --data", param_hint="--data")
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeRemainingColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("starting", total=None)

        def progress(label: str, done: int, total: int) -> None:
            bar.update(task, description=label, completed=done, total=total)

        histories, string_ids = real_histories(data)
        summary = sweep(
            [x.strip() for x in layouts.split(",")],
            levels,
            out,
            histories,
            string_ids,
            repo=repo,
            url=url,
            load=load,
            progress=progress,
        )
        bar.update(task, completed=len(summary["results"]), description="done")
    console.print((out / "report.md").read_text(), markup=False, highlight=False)
