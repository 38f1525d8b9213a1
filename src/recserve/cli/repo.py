"""``recserve repo``: a Triton model repository from an export (or a training run, exported first)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from recserve.artifacts.served import LAYOUTS, layouts_help
from recserve.cli.console import console, export_or_run, handle_errors
from recserve.cli.options import EXPLORE_NEW_HELP, Settings, takes
from recserve.constants import DEFAULT_MAX_K
from recserve.serving.triton_repository.repository_settings import RepositorySettings


@handle_errors
@takes(Settings("settings", (RepositorySettings,)))
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
        typer.Option(help="Comma-separated, of: " + layouts_help() + "."),
    ] = "fused",
    backend: Annotated[
        str | None,
        typer.Option(
            help="With --run: the fused model's export backend (see `recserve export`) \\[onnx on cpu, eager on "
            "gpu]; the native layout takes torchscript or onnx when named here, else onnx on cpu and torchscript "
            "on gpu."
        ),
    ] = None,
    precision: Annotated[
        str, typer.Option(help="With --run: fp32, fp16, bf16, fp8 (bf16, the output layer in 8 bits) or int8.")
    ] = "fp32",
    version: Annotated[int, typer.Option(help="Model version to write (add a new one beside the old).")] = 1,
    max_k: Annotated[int, typer.Option(help="With --run: the largest k a request may ask for.")] = DEFAULT_MAX_K,
    explore_new: Annotated[float, typer.Option(help="With --run: " + EXPLORE_NEW_HELP)] = 0.0,
    settings: RepositorySettings = RepositorySettings(),
) -> None:
    """Write a Triton model repository: config.pbtxt, the models and the validated export.

    Layouts: fused serves any export and string IDs through a python model; native serves the whole graph
    without Python (integer IDs, histories padded to a fixed length by the client); seed is the PoC's
    ensemble; echo measures the python stack alone. README.md (Serving) and docs/benchmarks.md say which to use when."""
    from recserve.pipeline import repository

    export_or_run(export, run)  # exactly one of them
    layouts = tuple(x.strip() for x in layout.split(",") if x.strip())
    if settings.session_store is None and any(LAYOUTS.get(x, LAYOUTS["fused"]).by_session for x in layouts):
        from recserve.cli.store_access import store_dir
        from recserve.sessions import embedded_store

        folder = store_dir(None)  # a laptop's default: recserve's embedded store, no root, started if need be
        store = embedded_store.start(folder)
        console.print(
            f"session store: recserve's embedded one in {folder} ({store.url}); --session-store names another"
        )
        settings = dataclasses.replace(settings, session_store=str(folder))
    with console.status(f"writing {', '.join(layouts)} into {out}"):
        summary = repository(
            out,
            layouts,
            settings,
            version,
            export=export,
            run=run,
            backend=backend,
            precision=precision,
            max_k=max_k,
            explore_new=explore_new,
        )
    console.print(f"{out}: " + ", ".join(m["name"] for m in summary["models"]) + f" (version {version})")
