"""``recserve sagemaker``: package a run for SageMaker, serve it locally, deploy it and invoke it."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, export_or_run, handle_errors, history_ids
from recserve.constants import PACKAGE_INSTANCES

app = typer.Typer(
    help="SageMaker: model.tar.gz, a local endpoint (/ping, /invocations), deployment, invocation.",
    no_args_is_help=True,
)


@app.command()
@handle_errors
def package(
    export: Annotated[
        Path | None,
        typer.Option(
            "--export",
            "-e",
            help="Export folder written by `recserve export` (eager for pytorch; torchscript or onnx for "
            "triton: the native layout, or onnx/eager without a native model: the fused one).",
        ),
    ] = None,
    run: Annotated[
        Path | None,
        typer.Option(
            "--run",
            "-r",
            help="Instead of --export: a run folder, exported "
            "(and validated) first: eager fp32 for pytorch, torchscript fp32 for "
            "triton (onnx for string IDs).",
        ),
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="The model.tar.gz to write.")] = Path("model.tar.gz"),
    runtime: Annotated[
        str,
        typer.Option(
            help="pytorch (SageMaker PyTorch container, code/inference.py) or "
            "triton (SageMaker Triton container, a model repository)."
        ),
    ] = "pytorch",
    device: Annotated[
        str,
        typer.Option(
            help="triton, with --run: cpu or gpu (cuda is taken for gpu), where the endpoint's model instances "
            "run; a gpu package is traced on this machine's GPU. With --export, the export's own device decides; "
            "the pytorch runtime's handler picks the endpoint's device itself."
        ),
    ] = "cpu",
    instances: Annotated[
        int | None,
        typer.Option(
            help="triton: model instances (on each GPU), set for the endpoint's machine "
            f"[{', '.join(f'{n} on {d}' for d, n in PACKAGE_INSTANCES.items())}]."
        ),
    ] = None,
) -> None:
    """Write model.tar.gz in the layout the chosen SageMaker container expects."""
    from recserve.pipeline import package as write_package
    from recserve.serving.sagemaker.package import RUNTIMES

    if runtime not in RUNTIMES:
        raise typer.BadParameter(f"{runtime!r}: expected one of {', '.join(RUNTIMES)}", param_hint="--runtime")
    source = export_or_run(export, run)
    with console.status(f"packaging {source} for the {runtime} container"):
        summary = write_package(out, runtime, export=export, run=run, device=device, instances=instances)
    console.print(f"{summary['package']}: {summary['model']} ({summary['backend']}), {summary['bytes'] / 1e6:.1f} MB")
    console.print("endpoint environment: " + ", ".join(f"{k}={v}" for k, v in summary["environment"].items()))


@app.command()
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


@app.command()
@handle_errors
def deploy(
    package_file: Annotated[
        Path | None, typer.Option("--package", help="Upload this model.tar.gz to model_data first.")
    ] = None,
    env_file: Annotated[Path | None, typer.Option(help="Settings file (default .env.inference).")] = None,
    endpoint_name: Annotated[str | None, typer.Option(help="Overrides RECSERVE_SAGEMAKER_ENDPOINT_NAME.")] = None,
    wait: Annotated[bool | None, typer.Option(help="Wait for InService (default: the settings' wait).")] = None,
    replace_failed: Annotated[
        bool,
        typer.Option(
            "--replace-failed", help="Delete an endpoint in Failed (it cannot be updated) and create it anew."
        ),
    ] = False,
) -> None:
    """Create the SageMaker model, endpoint configuration and endpoint.

    Settings: RECSERVE_SAGEMAKER_* environment variables or .env.inference.
    """
    from recserve.serving.sagemaker.cloud import deploy as run_deploy
    from recserve.serving.sagemaker.cloud import load_settings, upload

    settings = load_settings(env_file, endpoint_name=endpoint_name, wait=wait, replace_failed=replace_failed or None)
    if package_file is not None and settings.runtime == "triton":  # the model the package holds, not a guess
        from recserve.errors import ServingError
        from recserve.serving.sagemaker.cloud import instance_mismatch
        from recserve.serving.sagemaker.package import inspect_package

        info = inspect_package(package_file)  # one read of the archive
        model = info.triton_model(package_file)
        mismatch = instance_mismatch(info.on_gpus, settings.instance_type)
        if mismatch and mismatch[0] == "error":
            raise ServingError(f"{package_file}: {mismatch[1]}")
        if mismatch:
            console.print(f"[yellow]warning: {mismatch[1]}[/]")
        settings = settings.model_copy(update={"triton_model": model})
    if package_file is not None:
        with console.status(f"uploading {package_file} to {settings.model_data}"):
            upload(package_file, settings)
    with console.status(f"deploying endpoint {settings.endpoint_name}"):
        result = run_deploy(settings)
    console.print_json(json.dumps(result))


@app.command()
@handle_errors
def invoke(
    item_ids: Annotated[list[str], typer.Argument(help="History item IDs, oldest first.")],
    k: Annotated[int, typer.Option(help="How many items to return.")] = 10,
    url: Annotated[
        str | None, typer.Option(help="A local endpoint (http://127.0.0.1:8080) instead of SageMaker.")
    ] = None,
    package_file: Annotated[
        Path | None,
        typer.Option(
            "--package",
            help="The model.tar.gz the endpoint serves: says its runtime, and for triton the native model's "
            "history length and max k (needed to build its request).",
        ),
    ] = None,
    binary: Annotated[
        bool, typer.Option(help="triton runtime: send the tensors in Triton's binary form instead of JSON.")
    ] = False,
    env_file: Annotated[Path | None, typer.Option(help="Settings file (default .env.inference).")] = None,
    endpoint_name: Annotated[str | None, typer.Option(help="Overrides RECSERVE_SAGEMAKER_ENDPOINT_NAME.")] = None,
    string_ids: Annotated[bool, typer.Option(help="Send IDs as strings (a string-ID model).")] = False,
) -> None:
    """Ask an endpoint for one history's top k and print {"item_id": [...], "score": [...], "unknown_item_ids": n}.

    Each runtime is spoken to in its own protocol: the pytorch runtime's handler takes {"item_id": [...],
    "k": k}; the triton runtime's /invocations takes a KServe v2 request for the native model (the history
    padded to its length, k and exclude_seen), whose answer is read back into the same shape."""
    from recserve.errors import ServingError
    from recserve.serving.sagemaker import invocations
    from recserve.serving.sagemaker.package import inspect_package

    history = history_ids(item_ids, string_ids)
    settings = None
    if not url:
        from recserve.serving.sagemaker.cloud import load_settings

        settings = load_settings(env_file, endpoint_name=endpoint_name)
    held = inspect_package(package_file) if package_file else None
    runtime = held.runtime if held else settings.runtime if settings else "pytorch"
    shape = None
    if runtime == "triton":
        if held is None or package_file is None:
            raise typer.BadParameter(
                "a triton-runtime endpoint takes the native model's fixed history length: pass the package it "
                "serves (--package model.tar.gz)",
                param_hint="--package",
            )
        shape = held.native_shape(package_file)
        body, content_type = invocations.triton_request(history, k, shape, binary=binary)
    else:
        body, content_type = invocations.pytorch_request(history, k)
    if url:
        from recserve.serving.sagemaker.endpoint import invoke as post

        try:
            status, answer = post(url.rstrip("/"), body, content_type)
        except OSError as err:  # URLError, refused, timed out
            reason = getattr(err, "reason", err)
            raise ServingError(
                f"no endpoint answers at {url} ({reason}); start one with `recserve sagemaker serve "
                "--model model.tar.gz` (port 8080) or pass the right --url"
            ) from err
        if status != 200:
            raise ServingError(f"{url} answered {status}: {answer.decode(errors='replace')}")
    else:
        from recserve.serving.sagemaker.cloud import invoke_endpoint

        assert settings is not None
        _, answer = invoke_endpoint(settings, body, content_type)
    if shape is not None:
        answer = json.dumps(invocations.triton_answer(answer, k, shape)).encode()
    try:
        console.print_json(answer.decode())
    except (json.JSONDecodeError, UnicodeDecodeError):
        console.print(answer.decode(errors="replace"), highlight=False)
