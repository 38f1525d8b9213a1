"""``recserve sagemaker invoke``: one request to a local or deployed endpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from recserve.artifacts.catalogue import is_int64_text
from recserve.cli.console import console, handle_errors, history_ids


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
) -> None:
    """Ask an endpoint for one history's top k and print {"item_id": [...], "score": [...], "unknown_item_ids": n}.

    Each runtime is spoken to in its own protocol: the pytorch runtime's handler takes {"item_id": [...],
    "k": k}; the triton runtime's /invocations takes a KServe v2 request for the native model (the history
    padded to its length, k and exclude_seen), whose answer is read back into the same shape."""
    from recserve.errors import ServingError
    from recserve.serving.sagemaker import invocations
    from recserve.serving.sagemaker.package import inspect_package

    # sent as typed (numbers where every ID is one); the pytorch runtime's handler reads them as its catalogue
    # holds IDs, and the triton runtime's native model takes integers
    history: list[int] | list[str] = (
        item_ids if any(not is_int64_text(x) for x in item_ids) else [int(x) for x in item_ids]
    )
    settings = None
    if not url:
        from recserve.deploy.sagemaker.cloud import load_settings

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
        history = history_ids(item_ids, False, " (the triton runtime's native model)")
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
        from recserve.deploy.sagemaker.cloud import invoke_endpoint

        assert settings is not None
        _, answer = invoke_endpoint(settings, body, content_type)
    if shape is not None:
        answer = json.dumps(invocations.triton_answer(answer, k, shape)).encode()
    try:
        console.print_json(answer.decode())
    except (json.JSONDecodeError, UnicodeDecodeError):
        console.print(answer.decode(errors="replace"), highlight=False)
