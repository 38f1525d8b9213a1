"""``recserve sagemaker serve``: a package served on this machine with SageMaker's contract (/ping, /invocations)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, handle_errors


@handle_errors
def serve(
    model: Annotated[Path, typer.Option("--model", "-m", help="A model.tar.gz of either runtime.")],
    port: Annotated[int, typer.Option(help="Port of /ping and /invocations (SageMaker uses 8080).")] = 8080,
    workers: Annotated[int, typer.Option(help="pytorch runtime: TorchServe workers.")] = 1,
    startup_timeout_s: Annotated[float, typer.Option(help="Seconds to wait for the first real answer.")] = 180.0,
) -> None:
    """Serve model.tar.gz the way its SageMaker container does, until Ctrl-C or SIGTERM.

    A pytorch-runtime package (code/inference.py): the SageMaker PyTorch inference toolkit over TorchServe,
    on 127.0.0.1. A triton-runtime package (one model folder): the bundled Triton with its SageMaker
    frontend, the package's model the default, as the Triton container's serve script runs it; Triton 2.51's
    frontend listens on every interface, as in the container."""
    from recserve.serving.sagemaker.endpoint import LocalEndpoint, TritonEndpoint
    from recserve.serving.sagemaker.package import inspect_package

    runtime = inspect_package(model).runtime
    endpoint: LocalEndpoint | TritonEndpoint
    if runtime == "triton":
        endpoint = TritonEndpoint(model, port=port, startup_timeout_s=startup_timeout_s)
        status = "starting Triton with its SageMaker frontend"
    else:
        endpoint = LocalEndpoint(model, port=port, workers=workers, startup_timeout_s=startup_timeout_s)
        status = "starting TorchServe through the SageMaker inference toolkit"
    with console.status(status):
        endpoint.start()
    console.print(
        f"serving {model} ({runtime} runtime) at {endpoint.url} (/ping, /invocations); logs in {endpoint.log_path}"
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            if (code := endpoint.exit_code()) is not None:
                raise typer.Exit(code or 1)
    finally:
        endpoint.stop()
