"""What a rule written out for the first time costs a served model's batch, at catalogue scale (no graph run).

A python layout's rule book keeps up to ``MAX_RULE_MASKS`` compiled rules; a request whose ``where`` it has
not seen compiles it into the masks, and the runner's device copy of the masks is brought up to date. This
times exactly that (``RuleBook.check``, ``RuleBook.batch`` and the torch runner's ``DeviceMasks``) for a new
rule each call, with the book already full (the steady state of a shop whose requests bring many rules), and
for a rule the book holds. Item attributes are synthetic: a category of 20, a price and a year.

    python benchmarks/new_rule_cost.py --items 10000,100000,1000000 --calls 60 --out new-rule.json

Figures printed and written as JSON: p50 and p99 milliseconds a call, per catalogue size.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import polars as pl
import torch

from recserve.artifacts.item_table import attributes_of
from recserve.constants import MAX_RULE_MASKS
from recserve.export.runner import DeviceMasks
from recserve.rules.rule_book import RequestRules, RuleBook


def _attributes(items: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    table = pl.DataFrame(
        {
            "category": [f"c{n:02d}" for n in rng.integers(0, 20, items)],
            "price": rng.random(items) * 100,
            "year": rng.integers(1950, 2026, items).astype(float),
        }
    )
    return attributes_of(table)


def _call(book: RuleBook, device_masks: DeviceMasks, where: str) -> float:
    """Milliseconds of one batch's rule work for a one-row batch under ``where``."""
    rules = RequestRules(where=where)
    start = time.perf_counter()
    book.check(rules)
    batch = book.batch([rules], lambda ids: ids)
    device_masks(batch.masks)
    return (time.perf_counter() - start) * 1e3


def measure(items: int, calls: int) -> dict:
    book, device_masks = RuleBook(_attributes(items)), DeviceMasks(torch.device("cpu"))
    for n in range(MAX_RULE_MASKS):  # the book full: every new rule now drops the least recently used
        _call(book, device_masks, f'category == "c{n % 20:02d}" and year > {1900 + n}')
    new = [_call(book, device_masks, f'category in ("c01", "c07") and price < {n + 0.5}') for n in range(calls)]
    held = [_call(book, device_masks, f'category in ("c01", "c07") and price < {calls - 0.5}') for _ in range(calls)]
    figures = {}
    for name, times in (("new_rule", new), ("held_rule", held)):
        figures[f"{name}_p50_ms"] = round(float(np.percentile(times, 50)), 3)
        figures[f"{name}_p99_ms"] = round(float(np.percentile(times, 99)), 3)
    return {"items": items, "calls": calls, **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", default="10000,100000,1000000", help="catalogue sizes, comma-separated")
    parser.add_argument("--calls", type=int, default=60, help="new rules timed a size (and calls of a held one)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = []
    for items in (int(n) for n in args.items.split(",")):
        row = measure(items, args.calls)
        print(json.dumps(row))
        rows.append(row)
    if args.out is not None:
        host = {"machine": platform.machine(), "processor": platform.processor(), "torch": torch.__version__}
        args.out.write_text(json.dumps({"host": host, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
