"""``recserve promote``: a new run gated against the one a repository serves, written as the repository's next
version and loaded into its running server; ``recserve rollback``: the version before it, back."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, handle_errors
from recserve.errors import ServingError

URL_HELP = (
    "The server to load the version into, host:http_port (default: the detached server of this repository, "
    "`recserve status`). It must run with --model-control explicit. None: the version is written, and served "
    "by the next server started."
)
KEY_OPTION = typer.Option(
    "--admin-key", envvar="RECSERVE_ADMIN_KEY", help="The server's admin key (its --admin-key).", show_default=False
)


def _server_url(repo: Path, url: str | None) -> str | None:
    """The HTTP address of the server to load into: ``url``, else the live detached server of ``repo``."""
    if url is not None:
        return url
    from recserve.serving.triton_server.detached import read_records

    mine = [r for r in read_records() if Path(r.repo).resolve() == repo.resolve() and r.alive()]
    return f"{mine[0].host}:{mine[0].http_port}" if mine else None


def _control(url: str, admin_key: str | None):
    from recserve.serving.promotion import ModelControl

    if not admin_key:
        raise ServingError(f"the server at {url} loads versions only with its admin key: give --admin-key")
    control = ModelControl(url, admin_key)
    control.index()  # the server answers and takes the key: asked before anything is written or moved
    return control


def _confirm_answers(url: str, repo: Path, version: int, run: Path) -> list[str]:
    """One recommendation from ``version`` of each model that takes item IDs; the models that answered."""
    from recserve.artifacts.catalogue import read_catalogue
    from recserve.client.triton import RecommenderClient
    from recserve.constants import FUSED_MODEL, NATIVE_MODEL
    from recserve.serving.promotion import versions_of

    first = read_catalogue(run)[:1].tolist()
    answered = []
    for model in (m for m in (FUSED_MODEL, NATIVE_MODEL) if m in versions_of(repo)):
        with RecommenderClient(url, "http", model, version=str(version)) as client:
            client.recommend(first, k=1)
        answered.append(model)
    return answered


@handle_errors
def promote(
    run: Annotated[Path, typer.Option("--run", "-r", help="The candidate: a run folder of `recserve train`.")],
    repo: Annotated[Path, typer.Option("--repo", help="The repository `recserve repo` wrote, which a server serves.")],
    data: Annotated[
        Path | None,
        typer.Option(
            help="Whose test targets the gate ranks both runs on (default: the candidate's data folder; a time "
            "split's newest events, as a shop lives)."
        ),
    ] = None,
    tolerance: Annotated[
        float, typer.Option(help="The share of the serving run's NDCG@10 the candidate may lose and still pass.")
    ] = 0.01,
    gate: Annotated[bool, typer.Option(help="Rank both runs first and refuse a worse candidate.")] = True,
    url: Annotated[str | None, typer.Option(help=URL_HELP)] = None,
    admin_key: Annotated[str | None, KEY_OPTION] = None,
    device: Annotated[str, typer.Option(help="Where the gate ranks: cpu or gpu.")] = "cpu",
) -> None:
    """Promote a run: the gate (both runs ranked on the same newest events; a candidate worse beyond the tolerance
    is refused and nothing changes), then the repository's next version of every model, loaded into the running
    server and confirmed to answer. `recserve rollback` goes back."""
    from recserve.artifacts.repository_record import has_record, read_repository_info
    from recserve.artifacts.run_record import data_folder_of
    from recserve.devices import torch_device
    from recserve.models.run_loader import model_name
    from recserve.pipeline import write_next_version
    from recserve.serving.promotion import changing, record_serving, serving_version

    if not has_record(repo):
        raise ServingError(f"{repo}: not a repository `recserve repo` wrote")
    model_name(run)  # a folder that is no training run is refused in its own words, before anything else
    server = _server_url(repo, url)
    control = _control(server, admin_key) if server else None  # the key asked for before anything is done
    if gate:
        from recserve.train.comparison import gate as run_gate

        serving_run = _serving_run(repo, read_repository_info(repo))
        folder = data or data_folder_of(run)
        if folder is None:
            raise ServingError(f"{run}: its data folder is gone; give the gate's test events with --data")
        with console.status(f"ranking {run} and the serving run {serving_run} on {folder}"):
            verdict = run_gate(run, serving_run, folder, tolerance, torch_device(device))
        console.print(verdict.describe(), markup=False, highlight=False)
        if not verdict.passed:
            raise ServingError(
                f"{run} not promoted: {verdict.metric} {verdict.candidate:.4f} below {verdict.serving:.4f} x "
                f"(1 - {tolerance:g}); nothing changed"
            )
    with changing(repo):
        before = serving_version(repo)
        with console.status(f"writing version {before + 1} of every model of {repo}"):
            version = write_next_version(repo, run)
        if control is not None:
            _load_or_undo(control, repo, version, before, run)
        record_serving(repo, version)
    if control is None:
        console.print(f"{repo}: version {version} written (from {run}); no server of it runs: the next one serves it")


def _load_or_undo(control, repo: Path, version: int, before: int, run: Path) -> None:
    """Loads ``version`` everywhere and confirms it answers; on a failure moves it aside and loads ``before``."""
    from recserve.serving.promotion import load_everywhere, move_aside

    try:
        with console.status(f"loading version {version} into {control.http_url}"):
            took_s = load_everywhere(control, repo, version)
            answered = _confirm_answers(control.http_url, repo, version, run)
    except Exception:
        move_aside(repo, version)
        try:
            load_everywhere(control, repo, before)
            console.print(f"version {version} failed to load or answer: moved aside, version {before} serves again")
        except Exception as again:  # the first failure is the one to tell; this one is said beside it
            console.print(f"version {version} failed and was moved aside; loading {before} again failed too: {again}")
        raise
    console.print(
        f"{repo}: version {version} serves (from {run}), loaded in {took_s:.1f} s"
        + (f"; {', '.join(answered)} answered from it" if answered else ""),
        markup=False,
        highlight=False,
    )


def _serving_run(repo: Path, info: dict) -> Path:
    from recserve.serving.promotion import serving_version

    recorded = info.get("versions", {}).get(str(serving_version(repo)), {}).get("run") or info.get("run")
    if not recorded or not Path(recorded).is_dir():
        raise ServingError(
            f"{repo}: the run it serves ({recorded or 'not recorded'}) is not there to rank; give --no-gate to "
            "promote without the gate"
        )
    return Path(recorded)


@handle_errors
def rollback(
    repo: Annotated[Path, typer.Option("--repo", help="The repository to go back one version in.")],
    url: Annotated[str | None, typer.Option(help=URL_HELP)] = None,
    admin_key: Annotated[str | None, KEY_OPTION] = None,
) -> None:
    """Go back one version: the newest version of every model is moved aside (kept as rolled-back-N) and the
    version before it is loaded into the running server."""
    from recserve.artifacts.repository_record import has_record
    from recserve.serving.promotion import (
        changing,
        load_everywhere,
        move_aside,
        record_serving,
        serving_version,
        versions_of,
    )

    if not has_record(repo):
        raise ServingError(f"{repo}: not a repository `recserve repo` wrote")
    with changing(repo):
        current = serving_version(repo)
        older = [v for v in next(iter(versions_of(repo).values())) if v < current]
        if not older:
            raise ServingError(f"{repo}: version {current} is its only version; there is none to go back to")
        server = _server_url(repo, url)
        control = _control(server, admin_key) if server else None
        move_aside(repo, current)
        if control is not None:
            with console.status(f"loading version {older[-1]} into {server}"):
                took_s = load_everywhere(control, repo, older[-1])
        run = record_serving(repo, older[-1])
    where = f", loaded in {took_s:.1f} s" if control is not None else "; the next server started serves it"
    console.print(
        f"{repo}: version {older[-1]} serves again (from {run}){where}; version {current} moved aside",
        markup=False,
        highlight=False,
    )
