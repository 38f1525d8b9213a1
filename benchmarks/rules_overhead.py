"""What business rules cost an answer, and that every export backend keeps to them, at catalogue scale.

For each catalogue size, a synthetic run (random weights, the catalogue's shape; `recserve.bench.synthetic`)
with a category attribute is exported on each backend asked for (its parity check already runs with random
rules); then, through the serving core's predictor, one batch of real-length histories is answered under each
rule variant, checked item by item against the rule, and timed against the same batch without a rule:

    none         no rule (the hidden-items mask, empty)
    exclude-100  100 excluded item IDs a request
    category     a written rule, category == "c3" (a tenth of the catalogue)
    hidden-10pc  a tenth of the catalogue hidden
    include-50   a list of 50 items to keep to

Figures printed and written to --out as JSON (p50 and p99 milliseconds a call, and the ratio to `none` in the
same run).

    python benchmarks/rules_overhead.py --items 100000,1000000 --device cuda --backends eager,cudagraph \
        --out runs/rules-overhead.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import polars as pl

from recserve.bench.synthetic import make_random_run, synthetic_histories
from recserve.constants import ITEMS_FILE
from recserve.rules.rule_book import RequestRules
from recserve.serving.predictor import Predictor

CATEGORIES = 10


def _with_attributes(run: Path, items: int) -> None:
    """The synthetic run's item table: its IDs and a category of ten (``c0``..``c9``, item i in ``c{i % 10}``)."""
    ids = np.arange(1, items + 1)
    table = pl.DataFrame({"index": ids, "item_id": ids, "count": np.ones(items, dtype=np.int64)})
    table = table.with_columns(pl.Series("category", [f"c{i % CATEGORIES}" for i in range(items)]))
    table.write_parquet(run / ITEMS_FILE)


def _variants(items: int, batch: int, rng: np.random.Generator) -> dict:
    """Each variant: (rules a row, hidden mask or None, the item IDs a row may hold as a predicate)."""
    excluded = rng.choice(items, 100, replace=False) + 1
    included = rng.choice(items, 50, replace=False) + 1
    hidden = rng.random(items) < 0.1
    return {
        "none": ([None] * batch, None, lambda ids: np.ones(ids.shape, dtype=bool)),
        "exclude-100": ([RequestRules(exclude=excluded)] * batch, None, lambda ids: ~np.isin(ids, excluded)),
        "category": ([RequestRules(where='category == "c3"')] * batch, None, lambda ids: (ids - 1) % CATEGORIES == 3),
        "hidden-10pc": ([None] * batch, hidden, lambda ids: ~hidden[ids - 1]),
        "include-50": ([RequestRules(include=included)] * batch, None, lambda ids: np.isin(ids, included)),
    }


def _time(predictor: Predictor, histories, rules, seconds: float) -> dict:
    for _ in range(3):
        predictor.answer(histories, 10, True, rules)
    times = []
    deadline = time.perf_counter() + seconds
    while len(times) < 10 or time.perf_counter() < deadline:
        start = time.perf_counter()
        predictor.answer(histories, 10, True, rules)
        times.append((time.perf_counter() - start) * 1e3)
    return {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99)), "calls": len(times)}


def measure(items: int, backend: str, device: str, batches: list[int], work: Path, seconds: float) -> list[dict]:
    from recserve.export.exporter import export_run

    run = work / f"run-{items}"
    if not run.exists():
        make_random_run(run, num_items=items)
        _with_attributes(run, items)
    export = work / f"export-{items}-{backend}-{device}"
    started = time.perf_counter()
    manifest = export_run(run, backend, "fp32" if device == "cpu" else "bf16", export, device=device)
    build_s = time.perf_counter() - started
    predictor = Predictor.load(export, "cuda:0" if device == "cuda" else "cpu")
    rng = np.random.default_rng(0)
    rows = []
    for batch in batches:
        histories = synthetic_histories(items, count=batch, seed=batch)
        variants = _variants(items, batch, rng)
        for name, (rules, hidden, allowed) in variants.items():
            predictor.rules.hide(hidden if hidden is not None else np.zeros(items, dtype=bool))
            for r in rules:
                if r is not None:
                    predictor.rules.check(r)
            answers = predictor.answer(histories, 10, True, rules)
            held = answers.item_ids[np.isfinite(answers.scores)]
            kept = bool(allowed(held).all())
            row = {"items": items, "backend": backend, "device": device, "batch": batch, "variant": name}
            row |= {"keeps_to_rules": kept, "filled": int(np.isfinite(answers.scores).sum(1).min())}
            row |= _time(predictor, histories, rules, seconds)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if not kept:
                raise SystemExit(f"{backend} at {items} items broke the rule {name}")
        predictor.rules.hide(np.zeros(items, dtype=bool))
    base = {(r["batch"]): r["p50_ms"] for r in rows if r["variant"] == "none"}
    for r in rows:
        r["p50_vs_none"] = r["p50_ms"] / base[r["batch"]]
        r["p50_minus_none_ms"] = r["p50_ms"] - base[r["batch"]]
    rows[0]["export_build_s"] = round(build_s, 1)
    rows[0]["parity_max_score_diff"] = manifest.validation["max_score_diff"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", default="10000,100000", help="Catalogue sizes, comma-separated.")
    parser.add_argument("--backends", default="eager,onnx", help="Export backends, comma-separated.")
    parser.add_argument("--device", default="cpu", help="cpu or cuda.")
    parser.add_argument("--batches", default="1,64", help="Batch sizes, comma-separated.")
    parser.add_argument("--seconds", type=float, default=1.0, help="Timing per variant and batch.")
    parser.add_argument("--work", type=Path, default=Path("runs/rules-work"), help="Runs and exports.")
    parser.add_argument("--out", type=Path, default=Path("runs/rules-overhead.json"), help="JSON results.")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for items in (int(x) for x in args.items.split(",")):
        for backend in args.backends.split(","):
            rows += measure(
                items, backend, args.device, [int(b) for b in args.batches.split(",")], args.work, args.seconds
            )
    summary = {
        "command": "benchmarks/rules_overhead.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
        "host": platform.node(),
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"results in {args.out}")


if __name__ == "__main__":
    main()
