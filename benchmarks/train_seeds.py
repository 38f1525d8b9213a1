"""Trains variants of `recserve train` over several seeds, several runs at a time, and tabulates test metrics.

Each variant is NAME=OPTIONS (the options `recserve train` takes); every (variant, seed) is one run of the
real command in its own process, so several share a GPU. Each run's metrics.json becomes one line of
``--out`` (JSONL); the table gives the mean and spread per variant. ``--src`` runs another checkout's
recserve (its ``src`` folder) for a before/after comparison on the same data and seeds.

    python benchmarks/train_seeds.py --data runs/ml100k --seeds 0,1,2,3,4 --parallel 5 \\
        --variant "bf16=--device cuda" --variant "fp32=--device cuda --precision 32" \\
        --out benchmarks/results/quality/ml100k-seeds.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[1] / "src"
KEYS = ("full", "served", "full_no_exclusion", "sampled", "sampled_uniform")


def run_one(job: dict) -> dict:
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [job["src"], os.environ.get("PYTHONPATH")]))}
    cmd = [
        sys.executable,
        "-m",
        "recserve.cli.main",
        "train",
        "--data",
        job["data"],
        "--out",
        job["run"],
        "--seed",
        str(job["seed"]),
        *job["options"].split(),
    ]
    started = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=job["timeout_s"])
    wall_s = time.perf_counter() - started
    row = {
        "variant": job["variant"],
        "seed": job["seed"],
        "data": job["data"],
        "options": job["options"],
        "src": job["src"],
        "wall_s": round(wall_s, 1),
        "returncode": result.returncode,
    }
    metrics_path = Path(job["run"]) / "metrics.json"
    if result.returncode != 0 or not metrics_path.exists():
        return row | {"error": result.stderr[-2000:]}
    metrics = json.loads(metrics_path.read_text())
    row |= {
        "best_epoch": metrics.get("best_epoch"),
        "valid": metrics.get("valid"),
        "train_s": metrics.get("train", {}).get("seconds"),
        "loss": metrics.get("loss"),
        "test": {k: metrics["test"][k] for k in KEYS if k in metrics.get("test", {})},
        "popularity": {k: metrics["popularity"][k] for k in KEYS if k in metrics.get("popularity", {})},
        "repeated_targets": metrics.get("repeated_targets"),
    }
    if "test_validated" in metrics:  # --refit: the same test ranked with the weights validation chose
        row["test_validated"] = {k: metrics["test_validated"][k] for k in KEYS if k in metrics["test_validated"]}
    return row


def with_validated(rows: list[dict]) -> list[dict]:
    """``rows`` and, for each refit run among them, a row ``VARIANT/validated``: its test ranked with the
    weights validation chose before the refit (same seed, same run: a comparison with no training noise)."""
    return rows + [
        {"variant": f"{r['variant']}/validated", "seed": r["seed"], "test": r["test_validated"]}
        for r in rows
        if "test_validated" in r
    ]


def refit_gains(rows: list[dict]) -> str:
    """Each refit variant against its own validated weights, seed by seed ("" where no run refitted)."""
    validated = [r for r in rows if r["variant"].endswith("/validated")]
    tables = [
        paired([r for r in rows if r["variant"] == name], [v for v in validated if v["variant"] == f"{name}/validated"])
        for name in dict.fromkeys(v["variant"].removesuffix("/validated") for v in validated)
    ]
    return "\n".join(["refit against the weights validation chose (the same runs):", *tables]) if tables else ""


def summarize(rows: list[dict]) -> str:
    lines = [
        "| variant | seeds | test NDCG@10 full (mean ± sample sd) | HR@10 full | NDCG@10 served | NDCG@10 sampled | "
        "NDCG@10 sampled_uniform | best epoch | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for variant in dict.fromkeys(r["variant"] for r in rows):
        group = [r for r in rows if r["variant"] == variant and "test" in r]
        if not group:
            lines.append(f"| {variant} | failed | | | | | | | |")
            continue

        def stat(protocol, key, group=group):
            values = [r["test"][protocol][key] for r in group if protocol in r["test"]]
            spread = np.std(values, ddof=1) if len(values) > 1 else float("nan")  # the sample SD
            return f"{np.mean(values):.4f} ± {spread:.4f}" if values else "-"

        lines.append(
            f"| {variant} | {','.join(str(r['seed']) for r in group)} | {stat('full', 'ndcg@10')} | "
            f"{stat('full', 'hr@10')} | {stat('served', 'ndcg@10')} | {stat('sampled', 'ndcg@10')} | "
            f"{stat('sampled_uniform', 'ndcg@10')} | "
            f"{_mean_of(group, 'best_epoch')} | {_mean_of(group, 'wall_s')} |"
        )
    return "\n".join(lines)


def _mean_of(rows: list[dict], key: str) -> str:
    """The mean of ``key`` over the rows that have it (rows written by other scripts may not), or -."""
    values = [r[key] for r in rows if r.get(key) is not None]
    return f"{np.mean(values):.0f}" if values else "-"


def paired(rows: list[dict], baseline: list[dict]) -> str:
    """Each variant of ``rows`` against ``baseline``'s runs of the same seeds: test NDCG@10 (full) means and
    their ratio, each seed's difference, the paired t (the mean difference over its standard error) and the
    ratio of training times. A table in Markdown."""
    base = {r["seed"]: r for r in baseline if "test" in r}
    lines = [
        "| variant | seeds | NDCG@10 | baseline | ratio | paired t | per-seed differences | train time ratio |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for variant in dict.fromkeys(r["variant"] for r in rows):
        group = [r for r in rows if r["variant"] == variant and "test" in r and r["seed"] in base]
        if not group:
            continue
        ours = np.array([r["test"]["full"]["ndcg@10"] for r in group])
        theirs = np.array([base[r["seed"]]["test"]["full"]["ndcg@10"] for r in group])
        differences = ours - theirs
        t = differences.mean() / (differences.std(ddof=1) / np.sqrt(len(group))) if len(group) > 1 else float("nan")
        times = [(r.get("train_s"), base[r["seed"]].get("train_s")) for r in group]
        time_ratio = (
            np.mean([a for a, _ in times]) / np.mean([b for _, b in times])
            if all(all(x) for x in times)
            else float("nan")
        )
        lines.append(
            f"| {variant} | {','.join(str(r['seed']) for r in group)} | {ours.mean():.4f} ± "
            f"{ours.std(ddof=1) if len(group) > 1 else float('nan'):.4f} | {theirs.mean():.4f} | "
            f"{ours.mean() / theirs.mean():.3f} | {t:.2f} | {', '.join(f'{d:+.4f}' for d in differences)} | "
            f"{time_ratio:.2f} |"
        )
    return "\n".join(lines)


def read_rows(spec: str) -> list[dict]:
    """FILE or FILE:VARIANT: the rows of a JSONL file written by this script (those of one variant)."""
    path, _, variant = spec.partition(":")
    rows = with_validated([json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()])
    return [r for r in rows if not variant or r["variant"] == variant]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data")
    parser.add_argument("--variant", action="append", default=[], help="NAME=OPTIONS for `recserve train`")
    parser.add_argument(
        "--baseline",
        help="FILE[:VARIANT]: recorded runs to compare each variant with, seed by seed (paired t, time ratio)",
    )
    parser.add_argument("--tabulate", nargs="+", metavar="FILE", help="train nothing: the tables of these JSONL files")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--out", help="JSONL file (appended to)")
    parser.add_argument("--runs", default="runs/seeds", help="folder for the run folders")
    parser.add_argument("--src", default=str(SRC), help="the recserve source folder to run")
    parser.add_argument("--timeout-s", type=int, default=3600)
    args = parser.parse_args()
    baseline = read_rows(args.baseline) if args.baseline else None
    if args.tabulate:
        rows = [row for path in args.tabulate for row in read_rows(path)]
        print(summarize(rows))
        if refit_gains(rows):
            print(refit_gains(rows))
        if baseline is not None:
            print(paired(rows, baseline))
        return
    if not args.variant or not args.data or not args.out:
        parser.error("--data, --out and at least one --variant are needed to train (or --tabulate FILE ...)")
    jobs = []
    for spec, seed in itertools.product(args.variant, [int(s) for s in args.seeds.split(",")]):
        name, _, options = spec.partition("=")
        jobs.append(
            {
                "variant": name,
                "options": options,
                "seed": seed,
                "data": args.data,
                "src": args.src,
                "run": str(Path(args.runs) / f"{name}-seed{seed}"),
                "timeout_s": args.timeout_s,
            }
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with ThreadPoolExecutor(args.parallel) as pool, open(args.out, "a") as log:
        for row in pool.map(run_one, jobs):
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
            full = row.get("test", {}).get("full", {})
            print(
                f"{row['variant']} seed {row['seed']}: full NDCG@10 {full.get('ndcg@10', float('nan')):.4f} "
                f"({row['wall_s']} s){' ERROR ' + row['error'][-300:] if 'error' in row else ''}",
                flush=True,
            )
    rows = with_validated(rows)
    print(summarize(rows))
    if refit_gains(rows):
        print(refit_gains(rows))
    if baseline is not None:
        print(paired(rows, baseline))


if __name__ == "__main__":
    main()
