"""``recserve serve``: the Triton server on a model repository, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from recserve.cli.console import console, handle_errors


@handle_errors
def serve(
    repo: Annotated[Path, typer.Option("--repo", help="Model repository written by `recserve repo`.")],
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = "127.0.0.1",
    http_port: Annotated[int, typer.Option(help="HTTP port.")] = 8000,
    grpc_port: Annotated[int, typer.Option(help="gRPC port.")] = 8001,
    metrics_port: Annotated[int, typer.Option(help="Prometheus metrics port.")] = 8002,
    model_control: Annotated[str, typer.Option(help="none, poll (watch the repository for new versions) or "
                                                    "explicit (load over the API; needs --admin-key).")] = "none",
    admin_key: Annotated[Optional[str], typer.Option(envvar="RECSERVE_ADMIN_KEY", help="Key that unlocks the "
        "model-repository, shared-memory and logging APIs (header recserve-admin-key).")] = None,
    poll_secs: Annotated[int, typer.Option(help="Repository poll interval (poll mode).")] = 5,
    exit_timeout_secs: Annotated[int, typer.Option(help="Time in-flight requests get to finish on stop.")] = 30,
    gpu: Annotated[bool, typer.Option(help="Run the models on the GPU, whatever their instance kind "
                                           "(a repository written with --device gpu already does).")] = False,
    ready_timeout_s: Annotated[float, typer.Option(help="How long to wait for every model to be ready.")] = 300,
    watch_secs: Annotated[float, typer.Option(help="How often to check that every model process is alive; "
        "a dead one (Triton 2.51 does not restart it) restarts the server. 0: do not watch. Only with "
        "--model-control none, where model processes never change on purpose.")] = 5,
) -> None:
    """Start Triton on the repository; print the endpoints once every model is ready."""
    from recserve.serving.triton.launcher import ServerSettings, TritonServer

    settings = ServerSettings(
        host=host, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
        model_control_mode=model_control, restricted_api_key=admin_key, repository_poll_secs=poll_secs,
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
    console.print(f"ready: HTTP {host}:{http_port}, gRPC {host}:{grpc_port}, metrics {host}:{metrics_port} "
                  f"(log {server.log_path}){', models on the GPU' if gpu else ''}")
    stubs, next_check = server.stub_count(), time.monotonic() + watch_secs
    while not stop.wait(0.5):
        if server.process.poll() is not None:
            console.print(f"[red]tritonserver exited with code {server.process.returncode}[/]\n{server.failure_summary()}")
            raise typer.Exit(1)
        if watch_secs and model_control == "none" and time.monotonic() >= next_check:
            alive = server.stub_count()
            if alive < stubs:
                console.print(f"[yellow]{stubs - alive} model process(es) died: restarting the server[/]")
                console.print(f"recovered in {server.restart(ready_timeout_s):.1f} s")
                alive = server.stub_count()
            stubs, next_check = alive, time.monotonic() + watch_secs
    console.print("stopping: letting in-flight requests finish")
    code = server.stop()
    raise typer.Exit(0 if code in (0, None, -signal.SIGTERM) else 1)
