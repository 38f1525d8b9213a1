"""``recserve serve``: the Triton server on a model repository, until Ctrl-C or SIGTERM."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, handle_errors
from recserve.cli.options import Settings, takes
from recserve.serving.triton_server.launcher import ServerSettings


@handle_errors
@takes(Settings("settings", (ServerSettings,)))
def serve(
    repo: Annotated[Path, typer.Option("--repo", help="Model repository written by `recserve repo`.")],
    gpu: Annotated[
        bool,
        typer.Option(
            help="Run the models on the GPU, whatever their instance kind "
            "(a repository written with --device gpu already does)."
        ),
    ] = False,
    ready_timeout_s: Annotated[float, typer.Option(help="How long to wait for every model to be ready.")] = 300,
    watch_secs: Annotated[
        float,
        typer.Option(
            help="How often to check that every model process is alive; "
            "a dead one (Triton 2.51 does not restart it) restarts the server. 0: do not watch. With --model-control "
            "poll or explicit, where a version's unload ends its processes on purpose, only one that died."
        ),
    ] = 5,
    detach: Annotated[
        bool,
        typer.Option(
            help="Run in the background: return once every model is ready; `recserve status` lists it, "
            "`recserve stop` stops it."
        ),
    ] = False,
    settings: ServerSettings = ServerSettings(),
) -> None:
    """Start Triton on the repository; print the endpoints once every model is ready. Its log is kept with
    the last runs' in recserve's cache folder (servers/logs)."""
    from recserve.serving.triton_server.detached import new_log, start_detached
    from recserve.serving.triton_server.launcher import TritonServer
    from recserve.serving.triton_server.supervisor import serve_until_signalled

    if gpu:
        import torch

        if not torch.cuda.is_available():
            raise typer.BadParameter("no CUDA device is visible here", param_hint="--gpu")
    _start_embedded_store(repo)
    if detach:
        with console.status("starting Triton in the background"):
            record = start_detached(repo, settings, gpu, ready_timeout_s, watch_secs)
        console.print(
            f"ready: HTTP {record.host}:{record.http_port}, gRPC {record.host}:{record.grpc_port}, metrics "
            f"{record.host}:{record.metrics_port} (detached, process {record.pid}; log {record.triton_log}). "
            f"`recserve stop --http-port {record.http_port}` stops it."
        )
        return
    server = TritonServer(repo, settings, gpu=gpu, log_path=new_log("triton", settings.http_port))
    host, ports = settings.host, (settings.http_port, settings.grpc_port, settings.metrics_port)
    code = serve_until_signalled(
        server,
        watch_secs,
        ready_timeout_s,
        ready=lambda: console.print(
            f"ready: HTTP {host}:{ports[0]}, gRPC {host}:{ports[1]}, metrics {host}:{ports[2]} "
            f"(log {server.log_path}){', models on the GPU' if gpu else ''}"
        ),
        report=lambda m: console.print(f"[yellow]{m}[/]"),
        failed=lambda m: console.print(f"[red]{m}[/]"),
        starting=console.status("starting Triton"),
    )
    raise typer.Exit(code)


def _start_embedded_store(repo: Path) -> None:
    """Starts the repository's store where it is recserve's embedded one and does not run (after a reboot,
    say): its sessions are answered from the first request."""
    from recserve.artifacts.repository_record import read_repository_info, store_of
    from recserve.sessions import embedded_store

    folder = embedded_store.folder_of(store_of(read_repository_info(repo))) if repo.is_dir() else None
    if folder is not None and not embedded_store.running(folder):
        settings = embedded_store.start(folder)
        console.print(f"started the repository's session store in {folder} ({settings.url})")
