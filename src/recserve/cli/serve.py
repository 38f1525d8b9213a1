"""``recserve serve``: the Triton server on a model repository, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, handle_errors
from recserve.constants import GRPC_PORT, HTTP_PORT, METRICS_PORT


@handle_errors
def serve(
    repo: Annotated[Path, typer.Option("--repo", help="Model repository written by `recserve repo`.")],
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = "127.0.0.1",
    http_port: Annotated[int, typer.Option(help="HTTP port.")] = HTTP_PORT,
    grpc_port: Annotated[int, typer.Option(help="gRPC port.")] = GRPC_PORT,
    metrics_port: Annotated[int, typer.Option(help="Prometheus metrics port.")] = METRICS_PORT,
    model_control: Annotated[
        str,
        typer.Option(
            help="none, poll (watch the repository for new versions) or "
            "explicit (load over the API; needs --admin-key)."
        ),
    ] = "none",
    admin_key: Annotated[
        str | None,
        typer.Option(
            envvar="RECSERVE_ADMIN_KEY",
            help="Key that unlocks the model-repository, shared-memory and logging APIs (header recserve-admin-key).",
        ),
    ] = None,
    poll_secs: Annotated[int, typer.Option(help="Repository poll interval (poll mode).")] = 5,
    exit_timeout_secs: Annotated[int, typer.Option(help="Time in-flight requests get to finish on stop.")] = 30,
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
            "a dead one (Triton 2.51 does not restart it) restarts the server. 0: do not watch. Only with "
            "--model-control none, where model processes never change on purpose."
        ),
    ] = 5,
) -> None:
    """Start Triton on the repository; print the endpoints once every model is ready."""
    from recserve.serving.triton.launcher import ServerSettings, TritonServer
    from recserve.serving.triton.supervisor import supervise

    settings = ServerSettings(
        host=host,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        model_control_mode=model_control,
        restricted_api_key=admin_key,
        repository_poll_secs=poll_secs,
        exit_timeout_secs=exit_timeout_secs,
    )
    if gpu:
        import torch

        if not torch.cuda.is_available():
            raise typer.BadParameter("no CUDA device is visible here", param_hint="--gpu")
    server = TritonServer(repo, settings, gpu=gpu)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with console.status("starting Triton"):
        server.start()
        server.wait_ready(ready_timeout_s)
    console.print(
        f"ready: HTTP {host}:{http_port}, gRPC {host}:{grpc_port}, metrics {host}:{metrics_port} "
        f"(log {server.log_path}){', models on the GPU' if gpu else ''}"
    )
    exited = supervise(server, stop, watch_secs, ready_timeout_s, report=lambda m: console.print(f"[yellow]{m}[/]"))
    if exited is not None:
        console.print(f"[red]tritonserver exited with code {exited}[/]\n{server.failure_summary()}")
        raise typer.Exit(1)
    console.print("stopping: letting in-flight requests finish")
    code = server.stop()
    raise typer.Exit(0 if code in (0, None, -signal.SIGTERM) else 1)
