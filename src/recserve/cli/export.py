"""``recserve export``: the inference graph for a serving backend, validated; or the speed/accuracy report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, handle_errors
from recserve.cli.options import EXPLORE_NEW_HELP
from recserve.constants import DEFAULT_MAX_K
from recserve.export.backends import BACKENDS, DEFAULT_BACKEND


@handle_errors
def export(
    run: Annotated[Path, typer.Option("--run", "-r", help="Run folder written by `recserve train`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Export folder (or report folder with --report).")],
    backend: Annotated[
        str | None,
        typer.Option(
            help=f"{', '.join(BACKENDS[:-1])} or {BACKENDS[-1]} (default: "
            + ", ".join(f"{name} on {device}" for device, name in DEFAULT_BACKEND.items())
            + ")."
        ),
    ] = None,
    precision: Annotated[
        str,
        typer.Option(
            help="fp32; fp16 or bf16 (GPU); fp8: bf16 with an 8-bit output layer (GPUs of compute capability 8.9 "
            "and up; the CPU runs it for its accuracy); int8 (CPU)."
        ),
    ] = "fp32",
    device: Annotated[str, typer.Option(help="cpu or gpu (cuda is taken for gpu).")] = "cpu",
    max_k: Annotated[int, typer.Option(help="The most items a request may ask for.")] = DEFAULT_MAX_K,
    explore_new: Annotated[float, typer.Option(help=EXPLORE_NEW_HELP)] = 0.0,
    data: Annotated[Path | None, typer.Option(help="Data folder for the NDCG@10 change (default: the run's).")] = None,
    report: Annotated[bool, typer.Option(help="Export and time every backend and precision available here.")] = False,
    seconds: Annotated[float, typer.Option(help="Timing per variant and batch size (--report).")] = 1.0,
) -> None:
    """Export the ID-in, top-k-out graph; parity-checked against eager fp32 before anything is written."""
    from recserve.devices import torch_device

    device = torch_device(device)
    if report:
        from recserve.export.parity_report import build_report

        with console.status("building the report") as status:
            result = build_report(run, out, device, data, seconds, progress=lambda s: status.update(f"report: {s}"))
        console.print((out / "report.md").read_text(), markup=False, highlight=False)
        console.print(f"{len(result['results'])} rows -> {out}/report.json, report.md, report.png")
        return
    from recserve.export.backends import default_backend
    from recserve.export.exporter import export_run

    backend = backend or default_backend(device)
    with console.status(f"exporting {backend} {precision}"):
        manifest = export_run(
            run, backend, precision, out, device=device, max_k=max_k, data_dir=data, explore_new=explore_new
        )
    v = manifest.validation
    console.print(
        f"{backend} {precision} -> {out}: max score difference {v['max_score_diff']:.2e}, "
        f"top-10 overlap {v['top10_overlap']:.3f}"
        + (f", NDCG@10 change {v['ndcg10_delta']:+.4f}" if v.get("ndcg10_delta") is not None else "")
        + ("; its native model captured as CUDA graphs" if v.get("native_captured") else "")
    )
