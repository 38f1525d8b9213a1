"""What business rules cost an answer, and that every export backend keeps to them, at catalogue scale.

For each catalogue size, a synthetic run (random weights, the catalogue's shape; `recserve.bench.synthetic`)
with a category attribute is exported on each backend asked for (its parity check already runs with random
rules); then, through the serving core's predictor, one batch of real-length histories is answered under each
rule variant, checked item by item against the rule, and timed against the same batch without a rule:

    none         no rule (the hidden-items mask, empty)
    exclude-100  100 excluded item IDs a request
    category     a written rule, category in ("c03", "c13") (a tenth of the catalogue: the synthetic run's
                 category is the item ID modulo 20, `recserve.bench.synthetic.CATEGORIES`)
    hidden-10pc  a tenth of the catalogue hidden
    include-50   a list of 50 items to keep to

Figures printed and written to --out as JSON (p50 and p99 milliseconds a call, and the ratio to `none` in the
same run).

With --native, the native graph that recserve's Triton backend runs is timed instead, as the backend calls
it: its plain method (`none`) against its `ruled` method under each variant (the stored rule as the rule
bank's row, listed items as vocabulary indices padded to the 128 columns a captured graph takes, hidden items
out of the bank), the calls interleaved round by round so that a noisy host moves every variant alike;
medians and quartiles of the rounds.

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

from recserve.bench.synthetic import make_random_run, native_histories, synthetic_histories
from recserve.rules.rule_book import RequestRules
from recserve.serving.predictor import Predictor

CATEGORY_RULE = 'category in ("c03", "c13")'  # item IDs 3 modulo 10: a tenth of a synthetic run's catalogue


def _in_category(ids: np.ndarray) -> np.ndarray:
    """Whether items are ones ``CATEGORY_RULE`` lets through."""
    return ids % 10 == 3


def _variants(items: int, batch: int, rng: np.random.Generator) -> dict:
    """Each variant: (rules a row, hidden mask or None, the item IDs a row may hold as a predicate)."""
    excluded = rng.choice(items, 100, replace=False) + 1
    included = rng.choice(items, 50, replace=False) + 1
    hidden = rng.random(items) < 0.1
    return {
        "none": ([None] * batch, None, lambda ids: np.ones(ids.shape, dtype=bool)),
        "exclude-100": ([RequestRules(exclude=excluded)] * batch, None, lambda ids: ~np.isin(ids, excluded)),
        "category": ([RequestRules(where=CATEGORY_RULE)] * batch, None, _in_category),
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
        make_random_run(run, num_items=items)  # its items carry a category attribute
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


LISTED = 128  # the listed items a captured graph of recserve's backend takes (recserve.cc's kListed)


def measure_native(
    items: int, device: str, batches: list[int], work: Path, rounds: int, profile: bool = False
) -> list[dict]:
    import torch

    from recserve.export.exporter import export_run

    run = work / f"run-{items}"
    if not run.exists():
        make_random_run(run, num_items=items)  # its items carry a category attribute
    export = work / f"export-{items}-torchscript-{device}"
    export_run(run, "torchscript", "fp32" if device == "cpu" else "bf16", export, device=device)
    module = torch.jit.load(str(export / "native.pt"), map_location=device).eval()
    if device == "cpu":
        torch.set_num_threads(1)  # as the backend's CPU instances run (intra_op_thread_count 1)
    rng = np.random.default_rng(0)
    vocab = items + 2
    bank = np.zeros((2, vocab), dtype=bool)
    bank[:, 1:-1] = True
    bank[1, 1:-1] = _in_category(np.arange(1, items + 1))  # the stored rule: CATEGORY_RULE
    hidden = bank.copy()
    hidden[:, 1:-1] &= rng.random(items) >= 0.1
    rows = []
    as_t = lambda a: torch.as_tensor(a).to(device)  # noqa: E731
    for batch in batches:
        history = as_t(native_histories(items, batch, _native_length(export), seed=batch))
        k, exclude = as_t(np.full((batch, 1), 10, np.int32)), as_t(np.ones((batch, 1), bool))
        none = as_t(np.zeros((batch, LISTED), np.int64))
        listed = np.zeros((batch, LISTED), np.int64)
        listed[:, :100] = rng.choice(items, 100, replace=False) + 1
        kept = np.zeros((batch, LISTED), np.int64)
        kept[:, :50] = rng.choice(items, 50, replace=False) + 1
        row0, row1 = as_t(np.zeros(batch, np.int64)), as_t(np.ones(batch, np.int64))
        as_bank, as_hidden = as_t(bank), as_t(hidden)
        calls = _native_calls(
            module, (history, k, exclude), as_bank, as_hidden, (row0, row1), none, as_t(listed), as_t(kept)
        )
        times: dict[str, list[float]] = {name: [] for name in calls}
        with torch.inference_mode(), torch.jit.optimized_execution(False):
            for call in calls.values():
                for _ in range(5):
                    call()
            for _ in range(rounds):
                for name, call in calls.items():
                    if device != "cpu":
                        torch.cuda.synchronize()
                    started = time.perf_counter()
                    call()
                    if device != "cpu":
                        torch.cuda.synchronize()
                    times[name].append((time.perf_counter() - started) * 1e3)
            answers = {name: call()[0].cpu().numpy() for name, call in calls.items()}
            top = {name: _top_ops(call, device) for name, call in calls.items()} if profile else {}
            # on a GPU, each call also as the backend makes it: captured once, replayed (on a CPU, the
            # interleaved rounds above already time the call itself)
            replay = profile and device != "cpu"
            replayed = {name: _replayed_ms(call, device, rounds) for name, call in calls.items()} if replay else {}
        checks = {
            "category": _in_category,
            "exclude-100": lambda a, listed=listed: ~np.isin(a, listed),
            "hidden-10pc": lambda a: hidden[0, a],
            "include-50": lambda a, kept=kept: np.isin(a, kept),
        }
        base = float(np.median(times["none"]))
        for name, values in times.items():
            held = answers[name][answers[name] >= 0]
            ok = bool(checks[name](held).all()) if name in checks else True
            row = {"items": items, "backend": "native (recserve's backend's graph)", "device": device, "batch": batch}
            row |= {"variant": name, "keeps_to_rules": ok, "rounds": rounds}
            row |= {"p50_ms": float(np.median(values)), "p25_ms": float(np.percentile(values, 25))}
            row |= {"p50_minus_none_ms": float(np.median(values)) - base}
            if replayed:
                row |= {"replayed_p50_ms": replayed[name], "replayed_minus_none_ms": replayed[name] - replayed["none"]}
            if profile:
                row["top_ops"] = top[name]
            rows.append(row)
            print(json.dumps(row), flush=True)
            if not ok:
                raise SystemExit(f"the native graph at {items} items broke the rule {name}")
        if profile:
            rows += output_forms(run, batch, device, rounds)
    return rows


def output_forms(run: Path, batch: int, device: str, rounds: int) -> list[dict]:
    """The output layer's product alone at the export's shape and precision, in the three forms a step can
    take it: the plain step's product; the ruled step's, added in place into each row's gathered bias row
    (``addmm_``); and the product first, the gathered rows added after it. On a GPU each is captured as a CUDA
    graph and replayed, as recserve's backend replays its steps: whether the in-place form's matrix kernel is
    the slower one. The table is random: a kernel's time does not depend on the values."""
    import torch

    config = json.loads((run / "model_config.json").read_text())
    items, dtype = config["num_items"], torch.float32 if device == "cpu" else torch.bfloat16  # as exported
    generator = torch.Generator(device=device).manual_seed(0)
    table = torch.randn(items + 2, config["hidden"], generator=generator, device=device).to(dtype)
    query = torch.randn(batch, config["hidden"], generator=generator, device=device).to(dtype)
    rows = torch.randn(2, items + 2, generator=generator, device=device).to(dtype)
    pick = torch.zeros(batch, dtype=torch.long, device=device)
    forms = {
        "product": lambda: query @ table.T,
        "into gathered rows (addmm_)": lambda: rows[pick].addmm_(query, table.T),
        "product, then gathered rows added": lambda: (query @ table.T).add_(rows[pick]),
    }
    out = []
    with torch.inference_mode():
        for name, form in forms.items():
            ms = _replayed_ms(form, device, rounds)
            out.append({"items": items, "batch": batch, "device": device, "output_form": name, "p50_ms": ms})
            print(json.dumps(out[-1]), flush=True)
    return out


def _replayed_ms(call, device: str, rounds: int) -> float:
    """Median milliseconds of ``call``: on a GPU, of replays of it captured as one CUDA graph."""
    if device != "cpu":
        from recserve.bench.replay import replay_ms

        return replay_ms(call, rounds)
    times = []
    for _ in range(5 + rounds):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1e3)
    return float(np.median(times[5:]))


def _top_ops(call, device: str, calls: int = 20, count: int = 12) -> list[dict]:
    """The operators that took the most time in ``calls`` calls (on the GPU: its kernels' time), each as
    milliseconds a call: where a variant's extra time goes."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device != "cpu" else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            call()
        if device != "cpu":
            torch.cuda.synchronize()
    key = "self_device_time_total" if device != "cpu" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:count]
    return [
        {"op": e.key, "ms_per_call": getattr(e, key) / 1e3 / calls, "count_per_call": e.count / calls} for e in events
    ]


def _native_calls(module, inputs: tuple, bank, hidden, rows: tuple, none, listed, kept) -> dict:
    """Each variant's call of the native graph, as recserve's backend makes it (``inputs``: histories, k and
    exclude_seen; ``rows``: every row on the bank's row 0, and on row 1, the stored rule)."""
    every, stored = rows
    return {
        "none": lambda: module(*inputs),
        "category": lambda: module.ruled(*inputs, bank, stored, none, none),
        "exclude-100": lambda: module.ruled(*inputs, bank, every, listed, none),
        "hidden-10pc": lambda: module.ruled(*inputs, hidden, every, none, none),
        "include-50": lambda: module.ruled(*inputs, bank, every, none, kept),
    }


def _native_length(export: Path) -> int:
    from recserve.artifacts.export_manifest import ExportManifest

    return ExportManifest.read(export).window - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", default="10000,100000", help="Catalogue sizes, comma-separated.")
    parser.add_argument("--backends", default="eager,onnx", help="Export backends, comma-separated.")
    parser.add_argument("--device", default="cpu", help="cpu or cuda.")
    parser.add_argument("--batches", default="1,64", help="Batch sizes, comma-separated.")
    parser.add_argument("--seconds", type=float, default=1.0, help="Timing per variant and batch.")
    parser.add_argument("--work", type=Path, default=Path("runs/rules-work"), help="Runs and exports.")
    parser.add_argument("--out", type=Path, default=Path("runs/rules-overhead.json"), help="JSON results.")
    parser.add_argument("--native", action="store_true", help="Time recserve's backend's native graph instead.")
    parser.add_argument("--rounds", type=int, default=300, help="--native: interleaved rounds of every variant.")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="--native: each variant's costliest operators (top_ops in the JSON), its call captured and replayed "
        "as the backend replays it (replayed_p50_ms, on a GPU), and the output layer's product in each "
        "form a step can take it, timed alone (output_form rows).",
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for items in (int(x) for x in args.items.split(",")):
        if args.native:
            rows += measure_native(
                items, args.device, [int(b) for b in args.batches.split(",")], args.work, args.rounds, args.profile
            )
            continue
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
