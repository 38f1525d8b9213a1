"""A warm start against a cold training on a log cut in time, seed by seed (the living catalogue's target:
>= 0.98x the cold run's test NDCG@10 in <= 0.25x its time).

Yesterday's data holds the events up to ``--day-one`` of the log (a share of its events in time order);
today's holds every event, split by time (``--test-after``). For each seed: yesterday's run (the defaults),
today's cold run (the defaults) and today's warm start from yesterday's run (``--warm-epochs``), each the real
`recserve train` in its own process; both of today's are ranked on today's test targets (the full protocol,
ties against the target). Paired by seed; the training times are each run's `recserve train` wall time.

    python benchmarks/warm_start.py --log ml-100k --seeds 0,1,2 --device cuda --out warm-start.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def recserve(*args: str) -> float:
    """Runs `recserve ARGS` and returns its wall time; raises with its error output on a failure."""
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "recserve.cli.main", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"recserve {' '.join(args)}: {result.stdout[-1500:]}{result.stderr[-1500:]}")
    return time.perf_counter() - started


def prepare(log: str, work: Path, day_one: float, test_after: str) -> dict:
    import polars as pl

    from recserve.data.io import read_ml100k, read_table

    frame = read_ml100k()[0] if log == "ml-100k" else read_table(Path(log))
    cut = frame["timestamp"].quantile(day_one, "lower")
    frame.filter(pl.col("timestamp") <= cut).write_csv(work / "day-one.csv")
    frame.write_csv(work / "day-two.csv")
    recserve("data", str(work / "day-one.csv"), "--out", str(work / "day-one"))
    recserve(
        "data", str(work / "day-two.csv"), "--out", str(work / "day-two"), "--split", "time", "--test-after", test_after
    )
    one, two = (json.loads((work / name / "dataset.json").read_text()) for name in ("day-one", "day-two"))
    return {"day_one_items": one["items"], "day_two_items": two["items"], "day_one_events": one["interactions"],
            "day_two_events": two["interactions"], "split": two["split"]}  # fmt: skip


def recorded(run: Path) -> dict:
    """What the run's metrics.json says: its test NDCG@10, its fit time (training and validation alone, no
    process start or test ranking) and its best epoch."""
    metrics = json.loads((run / "metrics.json").read_text())
    return {"ndcg@10": metrics["test"]["full"]["ndcg@10"], "fit_s": metrics["train"]["seconds"],
            "best_epoch": metrics["best_epoch"], "cold_targets": metrics.get("cold_targets")}  # fmt: skip


def one_seed(work: Path, seed: int, device: str, warm_epochs: int, model: str) -> dict:
    common = ("--seed", str(seed), "--device", device, "--model", model)
    out = {"seed": seed}
    out["day_one_s"] = recserve("train", "--data", str(work / "day-one"), "--out", str(work / f"one-{seed}"), *common)
    out["cold_s"] = recserve("train", "--data", str(work / "day-two"), "--out", str(work / f"cold-{seed}"), *common)
    out["warm_s"] = recserve(  # the same seed's yesterday: warm and cold paired
        "train", "--data", str(work / "day-two"), "--out", str(work / f"warm-{seed}"), *common,
        "--warm-start", str(work / f"one-{seed}"), "--epochs", str(warm_epochs),
    )  # fmt: skip
    out["cold"], out["warm"] = recorded(work / f"cold-{seed}"), recorded(work / f"warm-{seed}")
    cold, warm = out["cold"]["ndcg@10"], out["warm"]["ndcg@10"]
    out["ndcg_ratio"] = warm / cold if cold else float("nan")
    out["time_ratio"] = out["warm_s"] / out["cold_s"]  # each `recserve train` whole
    out["fit_time_ratio"] = out["warm"]["fit_s"] / out["cold"]["fit_s"]
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log", default="ml-100k", help="ml-100k, or a CSV/Parquet log with timestamps")
    parser.add_argument("--day-one", type=float, default=0.9, help="yesterday's share of the events, in time")
    parser.add_argument("--test-after", default="95%", help="today's test cut (recserve data --test-after)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="sasrec")
    parser.add_argument("--warm-epochs", type=int, default=10, help="the warm start's budget")
    parser.add_argument("--parallel", type=int, default=1, help="seeds run side by side")
    parser.add_argument("--work", type=Path, default=Path("runs/warm-start"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = prepare(args.log, args.work, args.day_one, args.test_after)
    seeds = [int(s) for s in args.seeds.split(",")]
    with ThreadPoolExecutor(args.parallel) as pool:  # seeds side by side: their times share the machine
        rows = list(pool.map(lambda s: one_seed(args.work, s, args.device, args.warm_epochs, args.model), seeds))
    summary = {
        "log": args.log, "day_one_share": args.day_one, "test_after": args.test_after, "model": args.model,
        "device": args.device, "warm_epochs": args.warm_epochs, "parallel": args.parallel, "data": data, "seeds": rows,
        "mean_ndcg_ratio": float(np.mean([r["ndcg_ratio"] for r in rows])),
        "mean_time_ratio": float(np.mean([r["time_ratio"] for r in rows])),
        "mean_fit_time_ratio": float(np.mean([r["fit_time_ratio"] for r in rows])),
        "protocol": "today's test targets: each user's first event after the cut; full ranking, history excluded, "
        "ties against the target; paired by seed",
    }  # fmt: skip
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    ratios = (
        f"NDCG@10 {summary['mean_ndcg_ratio']:.3f}, time {summary['mean_time_ratio']:.3f} (each command), "
        f"{summary['mean_fit_time_ratio']:.3f} (fitting alone)"
    )
    print(f"warm / cold: {ratios} (mean of {len(rows)} seeds)")


if __name__ == "__main__":
    main()
