"""``recserve repo``: a Triton model repository from an export (or a training run, exported first)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, export_or_run, handle_errors
from recserve.constants import DEFAULT_MAX_K


@handle_errors
def repo(
    out: Annotated[Path, typer.Option("--out", "-o", help="Model repository to write or add to.")],
    export: Annotated[
        Path | None,
        typer.Option(
            "--export",
            "-e",
            help="Export folder written by `recserve export`: served as validated (the native layout needs a "
            "torchscript or onnx export, the seed layout a torchscript one).",
        ),
    ] = None,
    run: Annotated[
        Path | None,
        typer.Option(
            "--run",
            "-r",
            help="Instead of --export: a run folder, exported with --backend and --precision (and validated) first.",
        ),
    ] = None,
    layout: Annotated[
        str,
        typer.Option(
            help="Comma-separated: fused (model `recommender`, python), native (`recommender_native`: "
            "TorchScript or ONNX on Triton's own backends, integer IDs, no Python), seed (the PoC's ensemble), "
            "echo (fixed answer, the python server-stack ceiling), session (`recommender_session`: a session "
            "ID in, its history read from --session-store)."
        ),
    ] = "fused",
    backend: Annotated[
        str | None,
        typer.Option(
            help="With --run: the fused model's export backend (see `recserve export`) [onnx on cpu, eager on "
            "gpu]; the native layout takes torchscript or onnx when named here, else onnx on cpu and torchscript "
            "on gpu."
        ),
    ] = None,
    precision: Annotated[str, typer.Option(help="With --run: fp32, fp16, bf16 or int8.")] = "fp32",
    device: Annotated[str, typer.Option(help="cpu or gpu (cuda is taken for gpu): where model instances run.")] = "cpu",
    version: Annotated[int, typer.Option(help="Model version to write (add a new one beside the old).")] = 1,
    max_batch_size: Annotated[int, typer.Option(help="Largest dynamic batch.")] = 256,
    max_queue_delay_microseconds: Annotated[
        int | None,
        typer.Option(help="Batcher wait to fill a batch; default: 0 on cpu, 300 on gpu (measured best on each)."),
    ] = None,
    max_queue_size: Annotated[
        int,
        typer.Option(
            help="Queued requests beyond this are rejected (503); 0: "
            "unbounded. Any queue policy costs ~500 ms stalls on Triton 2.51 (see docs/benchmarks.md)."
        ),
    ] = 0,
    queue_timeout_ms: Annotated[int, typer.Option(help="Queued longer than this: rejected; 0: no timeout.")] = 0,
    instances: Annotated[int, typer.Option(help="Model instances (on each GPU that --gpus names).")] = 1,
    native_instances: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="The native layout's instances [on cpu: at least --instances and 4 a core, at most 8 (threads in "
            "the server: more cut the tail); on gpu: --instances].",
        ),
    ] = None,
    native_runtime: Annotated[
        str | None,
        typer.Option(
            help="What runs the native layout's TorchScript graph: recserve (recserve's own Triton backend: "
            "one CUDA graph per batch size on GPUs) or pytorch (Triton's PyTorch backend, operator by operator) "
            "[recserve on gpu, pytorch on cpu]. An onnx export runs on the onnxruntime backend.",
        ),
    ] = None,
    gpus: Annotated[
        str,
        typer.Option(
            help="With --device gpu: comma-separated GPU ids, e.g. 0,1, each "
            "given --instances instances; empty: Triton places them."
        ),
    ] = "",
    max_k: Annotated[int, typer.Option(help="With --run: the largest k a request may ask for.")] = DEFAULT_MAX_K,
    versions_served: Annotated[int, typer.Option(help="Serve the newest N versions.")] = 1,
    response_cache: Annotated[bool, typer.Option(help="Enable Triton's response cache for the model.")] = False,
    session_store: Annotated[
        Path | None,
        typer.Option(
            help="The session layout's store: a folder of `recserve store start`, or a JSON file of its settings "
            "(url, username, password_file, prefix, window, ttl_s, timeout_s; never the password itself)."
        ),
    ] = None,
) -> None:
    """Write a Triton model repository: config.pbtxt, the models and the validated export.

    Layouts: fused serves any export and string IDs through a python model; native serves the whole graph
    without Python (integer IDs, histories padded to a fixed length by the client); seed is the PoC's
    ensemble; echo measures the python stack alone. docs/serving.md says which to use when."""
    from recserve.devices import serving_device
    from recserve.pipeline import repository
    from recserve.serving.triton.repository_settings import RepositorySettings

    export_or_run(export, run)  # exactly one of them
    settings = RepositorySettings(
        max_batch_size=max_batch_size,
        max_queue_delay_microseconds=max_queue_delay_microseconds,
        max_queue_size=max_queue_size,
        queue_timeout_microseconds=queue_timeout_ms * 1000,
        instance_count=instances,
        native_instance_count=native_instances,
        native_runtime=native_runtime,
        device=serving_device(device),
        response_cache=response_cache,
        versions_served=versions_served,
        gpus=_gpu_ids(gpus),
        session_store=str(session_store) if session_store else None,
    )
    layouts = tuple(x.strip() for x in layout.split(",") if x.strip())
    with console.status(f"writing {', '.join(layouts)} into {out}"):
        summary = repository(
            out, layouts, settings, version, export=export, run=run, backend=backend, precision=precision, max_k=max_k
        )
    console.print(f"{out}: " + ", ".join(m["name"] for m in summary["models"]) + f" (version {version})")


def _gpu_ids(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as err:
        raise typer.BadParameter(f"{text!r}: expected GPU ids such as 0,1", param_hint="--gpus") from err
