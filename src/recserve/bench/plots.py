"""Plots drawn from saved benchmark rows: throughput against p99, and per-step server latency."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from recserve.bench.load_report import row_label


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_latency_throughput(rows: list[dict], path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for layout in dict.fromkeys(row_label(r) for r in rows):
        points = sorted(
            (r["throughput_rps"], r["p99_ms"], r.get("concurrency", r.get("request_rate")))
            for r in rows
            if row_label(r) == layout and "throughput_rps" in r
        )
        if not points:
            continue
        xs, ys, labels = zip(*points)
        ax.plot(xs, ys, marker="o", label=layout)
        for x, y, label in points:
            ax.annotate(f"{label:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
    ax.set(xlabel="throughput (requests/s)", ylabel="p99 latency (ms)", title="throughput against p99 (labels: load)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_steps(rows: list[dict], path: Path) -> None:
    """Stacked server-side milliseconds per request (queue, input, infer, output) for each step and run."""
    plt = _pyplot()
    parts = ("queue_ms", "compute_input_ms", "compute_infer_ms", "compute_output_ms")
    bars, labels = [], []
    for r in rows:
        for name, step in r.get("steps", {}).items():
            bars.append([step[p] for p in parts])
            labels.append(f"{row_label(r)}@{r.get('concurrency', r.get('request_rate')):g}\n{name}")
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(bars)), 4.5))
    bottom = [0.0] * len(bars)
    for i, part in enumerate(parts):
        values = [b[i] for b in bars]
        ax.bar(range(len(bars)), values, bottom=bottom, label=part.removesuffix("_ms"))
        bottom = [a + b for a, b in zip(bottom, values)]
    ax.set_xticks(range(len(bars)), labels, rotation=60, ha="right", fontsize=7)
    ax.set(ylabel="ms per request (server side)", title="where the server time goes")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_summary(summary_json: Path, out: Path) -> None:
    """Both plots from a saved summary.json."""
    rows = json.loads(Path(summary_json).read_text())["results"]
    plot_latency_throughput(rows, Path(out) / "throughput_latency.png")
    plot_steps(rows, Path(out) / "steps.png")


if __name__ == "__main__":  # python -m recserve.bench.plots SUMMARY_JSON [OUT_DIR]
    plot_summary(Path(sys.argv[1]), Path(sys.argv[2] if len(sys.argv) > 2 else Path(sys.argv[1]).parent))
