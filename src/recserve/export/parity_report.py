"""The accuracy-versus-speed report: every backend and precision available here, timed at several batch sizes."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

BATCH_SIZES = (1, 8, 64, 256)


def variants(device: str) -> list[tuple[str, str]]:
    """(backend, precision) pairs worth trying on this device."""
    if device == "cpu":
        return [
            ("eager", "fp32"),
            ("eager", "bf16"),
            ("eager", "int8"),
            ("torchscript", "fp32"),
            ("torchscript", "fp8"),  # its accuracy: float8 products are a GPU's speed, not a CPU's
            ("compile", "fp32"),
            ("aoti", "fp32"),
            ("onnx", "fp32"),
            ("onnx", "int8"),
        ]
    return [
        (b, p)
        for b in ("eager", "cudagraph", "torchscript", "compile", "aoti", "torch_tensorrt")
        for p in ("fp32", "fp16", "bf16", "fp8")
        if p != "fp8" or b in ("cudagraph", "torchscript")  # fp8: the GPUs that have it (else listed as skipped)
    ]


def time_runner(runner, inputs, seconds: float = 1.0, min_calls: int = 5, warmup: int = 3) -> dict:
    """Per-call latency over repeated calls on the same inputs; warm-up calls are discarded."""
    for _ in range(warmup):
        runner(*inputs)
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < min_calls or time.perf_counter() < deadline:
        start = time.perf_counter()
        runner(*inputs)
        times.append(time.perf_counter() - start)
    ms = np.array(times) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "calls": len(times)}


def build_report(
    run_dir: Path,
    out: Path,
    device: str = "cpu",
    data_dir: Path | None = None,
    seconds: float = 1.0,
    progress: Callable[[str], None] = lambda _: None,
    backends: tuple[str, ...] | None = None,
) -> dict:
    """Exports each variant under ``out/exports``, times it and writes report.json, report.md and report.png.

    Args:
        backends: only these backends (default: every one worth trying on the device).
    """
    from recserve.export.backends import load_runner, spec_of
    from recserve.export.exporter import export_run
    from recserve.export.graph import example_inputs

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows, skipped = [], []
    for backend, precision in [v for v in variants(device) if backends is None or v[0] in backends]:
        progress(f"{backend} {precision}")
        target = out / "exports" / f"{backend}-{precision}"
        try:
            manifest = export_run(run_dir, backend, precision, target, device=device, data_dir=data_dir)
        except Exception as err:
            skipped.append({"backend": backend, "precision": precision, "reason": str(err)})
            log.warning("skipped %s %s: %s", backend, precision, err)
            continue
        runner = load_runner(target, manifest, device)
        spec = spec_of(target, manifest)
        validation = manifest.validation
        for batch in BATCH_SIZES:
            inputs = [t.numpy() for t in example_inputs(spec, batch, spec.window - 1, seed=batch)]
            timing = time_runner(runner, inputs, seconds=seconds)
            rows.append(
                {
                    "backend": backend,
                    "precision": precision,
                    "batch_size": batch,
                    **timing,
                    "throughput": batch / (timing["p50_ms"] / 1e3),
                    "top10_overlap": validation["top10_overlap"],
                    "ndcg10_delta": validation.get("ndcg10_delta", 0.0),
                    "build_s": manifest.build_s,
                }
            )
    report = {
        "device": device,
        "run": str(run_dir),
        "results": rows,
        "skipped": skipped,
        "throughput_unit": "recommendations per second at the p50 call latency",
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(report_markdown(report))
    try:
        plot_report(report, out / "report.png")
    except ImportError:  # no matplotlib on this machine: plot later from report.json
        log.warning("matplotlib is missing: no report.png")
    return report


def report_markdown(report: dict) -> str:
    lines = [
        f"# Export report ({report['device']})",
        "",
        "| backend | precision | batch | p50 ms | p99 ms | recs/s | top-10 overlap | NDCG@10 change |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        delta = "" if r["ndcg10_delta"] is None else f"{r['ndcg10_delta']:+.4f}"
        lines.append(
            f"| {r['backend']} | {r['precision']} | {r['batch_size']} | {r['p50_ms']:.3f} | "
            f"{r['p99_ms']:.3f} | {r['throughput']:,.0f} | {r['top10_overlap']:.3f} | {delta} |"
        )
    for s in report["skipped"]:
        lines.append(f"\nSkipped {s['backend']} {s['precision']}: {s['reason']}")
    return "\n".join(lines) + "\n"


def plot_report(report: dict, path: Path, batch_size: int = 64) -> None:
    """Top-10 overlap with eager fp32 against throughput at one batch size, one point per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in (r for r in report["results"] if r["batch_size"] == batch_size):
        ax.scatter(r["throughput"], r["top10_overlap"], s=40)
        ax.annotate(
            f"{r['backend']} {r['precision']}",
            (r["throughput"], r["top10_overlap"]),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=8,
        )
    ax.set(
        xscale="log",
        xlabel=f"recommendations/s at batch {batch_size} (log)",
        ylabel="top-10 overlap with eager fp32",
        title=f"accuracy against speed ({report['device']})",
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
