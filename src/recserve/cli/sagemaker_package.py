"""``recserve sagemaker package``: a run or an export as SageMaker's model.tar.gz."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, export_or_run, handle_errors
from recserve.constants import PACKAGE_INSTANCES


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
