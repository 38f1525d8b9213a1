"""GPU benchmark: the fused, native, seed and echo layouts side by side on one GPU, written under OUT; and by
session beside by item IDs (the variants ``native_session-...`` and ``session-...``, recserve's embedded
store in ``--work``).

Run by `make bench-gpu` (scripts/bench_gpu.sh) on a GPU host with the normal install, or by
`scripts/offline_gpu.sh bench` on an offline one (which sets up the carried server and perf_analyzer).
Models: a BERT4Rec with random weights at production size (100,000 items, hidden 256, 2 layers, 4 heads,
window 40) and the trained ML-100K model when its folder is given.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from recserve.bench.load_report import ratios, write_report
from recserve.bench.load_settings import LoadSettings
from recserve.bench.perf_analyzer import LoadLevel
from recserve.bench.step_log import keep_step_summary
from recserve.bench.sweep import sweep
from recserve.bench.synthetic import make_random_run, synthetic_histories
from recserve.host import describe
from recserve.option_fields import add_arguments, from_arguments
from recserve.pipeline import repository_from_run
from recserve.serving.triton_repository.native_configs import RECSERVE_BACKEND
from recserve.serving.triton_repository.repository_settings import RepositorySettings
from recserve.sessions import embedded_store

log = logging.getLogger("serving_layouts")
SLO_P99_MS = 10.0  # the GPU targets' objective
STORED_RULES = "rules.toml"  # in --work: the stored rule --rules may name (rule:bench_category)


def variants(instances: int, delay_us: int, device: str) -> dict[str, dict]:
    batched = RepositorySettings(
        device=device,
        instance_count=instances,
        max_queue_delay_microseconds=delay_us,
        max_batch_size=512,
        max_queue_size=8192,
    )
    on_gpus = {  # ``instances`` model instances on each GPU named
        f"fused-eager-bf16-gpus{''.join(map(str, gpus))}": {
            "layout": "fused",
            "backend": "eager",
            "precision": "bf16",
            "settings": dataclasses.replace(batched, gpus=gpus),
        }
        for gpus in ((0,), (0, 1))
    }
    # the whole graph in TorchScript on Triton's PyTorch backend (operator by operator) or on recserve's own
    # backend (CUDA graphs per batch size); answers checked against fused at the same precision
    native = {
        f"native-{runtime}-{precision}": {
            "layout": "native",
            "backend": "torchscript",
            "precision": precision,
            "settings": dataclasses.replace(batched, native_runtime="pytorch" if runtime == "torchscript" else runtime),
            "check": True,
        }
        for precision in ("bf16", "fp8", "fp32")  # fp8: bf16 with an 8-bit output layer
        for runtime in ("torchscript", "recserve")
    }
    plain = dataclasses.replace(batched, max_queue_size=0, max_queue_delay_microseconds=300)  # no queue policy
    for name in list(native):
        native[f"{name}-plain"] = native[name] | {
            "settings": dataclasses.replace(plain, native_runtime=native[name]["settings"].native_runtime)
        }
    native["echo-plain"] = {"layout": "echo", "settings": plain}
    # recserve's backend without a graph, batched as the native variants are: their figures over its are the
    # model's own cost on this host (native over floor)
    native["floor-plain"] = {"layout": "floor", "settings": plain}
    for gpus in ((0,), (0, 1)):  # the native layout's instances on one GPU, or on each of two
        for runtime in ("torchscript", "recserve"):
            base = native[f"native-{runtime}-bf16-plain"]
            native[f"native-{runtime}-bf16-plain-gpus{''.join(map(str, gpus))}"] = base | {
                "settings": dataclasses.replace(base["settings"], gpus=gpus)
            }
    # by session beside by item IDs, from the same export in one repository, swept level by level together:
    # recserve's backend reading the store in C++, and the python model over the predictor (the store: --work's)
    native["native_session-recserve-bf16-plain"] = native["native-recserve-bf16-plain"] | {
        "layouts": ("native", "native_session"),
        "check": False,
    }
    native["session-eager-bf16"] = {
        "layout": "fused",
        "layouts": ("fused", "session"),
        "backend": "eager",
        "precision": "bf16",
        "settings": batched,
    }
    for precision in ("fp32", "bf16"):  # the python stub around a CUDA graph, without a queue policy
        native[f"fused-cudagraph-{precision}-plain"] = {
            "layout": "fused",
            "backend": "cudagraph",
            "precision": precision,
            "settings": plain,
        }
    return (
        on_gpus
        | native
        | {
            "seed": {"layout": "seed", "settings": RepositorySettings(device=device, instance_count=1)},
            "echo": {"layout": "echo", "settings": batched},
            "fused-eager-fp32": {"layout": "fused", "backend": "eager", "precision": "fp32", "settings": batched},
            "fused-eager-bf16": {"layout": "fused", "backend": "eager", "precision": "bf16", "settings": batched},
            "fused-compile-bf16": {"layout": "fused", "backend": "compile", "precision": "bf16", "settings": batched},
            "fused-aoti-bf16": {"layout": "fused", "backend": "aoti", "precision": "bf16", "settings": batched},
            "fused-cudagraph-fp32": {
                "layout": "fused",
                "backend": "cudagraph",
                "precision": "fp32",
                "settings": batched,
            },
            "fused-cudagraph-bf16": {
                "layout": "fused",
                "backend": "cudagraph",
                "precision": "bf16",
                "settings": batched,
            },
        }
    )


def gpu_name() -> str:
    try:
        return (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
            )
            .stdout.strip()
            .splitlines()[0]
        )
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variants", default="seed,echo,fused-eager-bf16")
    parser.add_argument(
        "--concurrency",
        default="1,16,64,128,256",
        help="levels; a level given again is run again (1,1,1: three rounds, each every --rules variant in turn), "
        "and the rules' cost at it is the median over the rounds",
    )
    # the load's knobs: recserve bench's (LoadSettings), with this script's SLO; --rules' rule:bench_category is
    # one of the synthetic run's 20 categories (every variant then has the store and the stored rule)
    add_arguments(parser, LoadSettings, defaults={"slo_p99_ms": SLO_P99_MS})
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--delay-us", type=int, default=100)
    parser.add_argument(
        "--client-cpus",
        type=int,
        default=0,
        help="pin perf_analyzer to this many of the usable cores and the server (this process's children) to "
        "the others; 0: both share every core",
    )
    parser.add_argument("--ml100k", type=Path, help="run folder of the trained ML-100K model, with histories.npz")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu-bench"))
    parser.add_argument("--device", default="gpu", help="gpu, or cpu to try the script on a small model")
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument(
        "--step-summary-s",
        type=int,
        default=0,
        help="recserve's backend logs each instance's batch steps (p50/p99/max) every N seconds; the lines go to "
        "each such variant's step-summary.log (0: off). With --rules, the summary's rule_steps_by_variant compares "
        "each step's median in the periods with no ruled batch and in those with only ruled ones: run one level "
        "(--concurrency 1,1,1) with periods shorter than a variant's run (2)",
    )
    parser.add_argument(
        "--export-report",
        default="",
        help="backends to time with `recserve export --report` "
        "first (comma-separated), e.g. eager,cudagraph,torchscript",
    )
    args = parser.parse_args()
    if args.client_cpus and args.client_cpus >= len(os.sched_getaffinity(0)):
        parser.error(f"--client-cpus {args.client_cpus}: only {len(os.sched_getaffinity(0))} cores are usable")
    return args


def pinned_load(args: argparse.Namespace) -> LoadSettings:
    """The load's settings; with --client-cpus, perf_analyzer's cores, the server (this process's children)
    keeping to the others from here on."""
    cores = sorted(os.sched_getaffinity(0))
    client_cpus = tuple(cores[: args.client_cpus]) if args.client_cpus else ()
    if client_cpus:
        os.sched_setaffinity(0, cores[args.client_cpus :])  # the server inherits the rest
    return from_arguments(LoadSettings, args, client_cpus=client_cpus).with_client_threads()


def run_variant(
    name: str,
    spec: dict,
    args: argparse.Namespace,
    load: LoadSettings,
    levels: list[LoadLevel],
    histories: list[np.ndarray],
    run: Path,
    store: Path,
) -> dict:
    """One variant's repository written from ``run`` and swept at ``levels`` with requests of ``histories``; its
    step summaries and, where the server stopped answering, its log's tail kept beside its report."""
    repo, layouts, settings = args.work / f"repo-{name}", spec.get("layouts", (spec["layout"],)), spec["settings"]
    if "layouts" in spec or load.rules:
        settings = dataclasses.replace(settings, session_store=str(store))
    if load.rules:
        settings = dataclasses.replace(settings, rules=str(args.work / STORED_RULES))
    if args.step_summary_s and settings.native_runtime == RECSERVE_BACKEND:  # the variants on recserve's backend
        settings = dataclasses.replace(settings, step_summary_s=args.step_summary_s)
    repository_from_run(run, repo, layouts, settings, spec.get("backend", "eager"), spec.get("precision", "fp32"))
    if spec.get("check"):  # the fused layout beside it (eager, same precision) for compare_with_fused
        repository_from_run(run, repo, ("fused",), spec["settings"], "eager", spec["precision"])
    load = dataclasses.replace(load, compare_with_fused=bool(spec.get("check")))
    summary = sweep(list(layouts), levels, args.out / name, histories, repo=repo, load=load)
    text = Path(summary["server_log"]).read_text(errors="replace") if summary.get("server_log") else ""
    if settings.step_summary_s:
        summary["rule_steps"] = keep_step_summary(text, args.out / name, bool(load.rules))
    if summary.get("stopped") and text:  # why the server stopped answering
        (args.out / name / "server-log-tail.txt").write_text("\n".join(text.splitlines()[-300:]) + "\n")
    return summary


def ml100k_rows(args: argparse.Namespace, load: LoadSettings, settings: RepositorySettings) -> list[dict]:
    """The trained ML-100K model (--ml100k) on its own test histories, fused beside seed at c=1 and c=64."""
    bundle = np.load(args.ml100k / "histories.npz")
    real = np.split(bundle["items"], bundle["offsets"][1:-1])
    repo = args.work / "repo-ml100k"
    repository_from_run(args.ml100k, repo, ("fused", "seed"), settings, "cudagraph", "fp32")
    levels = [LoadLevel("concurrency", 1.0), LoadLevel("concurrency", 64.0)]
    summary = sweep(["fused", "seed"], levels, args.out / "ml100k", real, repo=repo, load=load)
    return [row | {"variant": f"ml100k-{row['layout']}", "model": "ml100k-trained"} for row in summary["results"]]


def variant_ratios(rows: list[dict], table: dict[str, dict], protocol: str) -> dict[str, dict]:
    """Each fused or native variant against echo, seed and the floor (native: and the fused variant of its
    precision); by session against by item IDs in the variant's own rows; all over ``protocol`` (the first a
    sweep over both ran; each variant's summary has its HTTP against gRPC)."""
    per_variant = {}
    # the layouts compared without rules (rules in rule_overhead), over one protocol
    plain = [r for r in rows if "rules" not in r and r.get("protocol", protocol) == protocol]
    candidates = {r["variant"]: r["layout"] for r in plain if r["layout"] in ("fused", "native")}
    for name, layout in candidates.items():
        chosen = [r for r in plain if r["variant"] == name and r["model"] == "random"]
        if "layouts" in table.get(name, {}):  # by session against by item IDs, both in the variant's rows
            per_variant[name] = ratios(chosen, slo_p99_ms=SLO_P99_MS)
            continue
        echo = "echo-plain" if "-plain" in name else "echo"
        others = [r for r in plain if r["variant"] in ("seed", echo, "floor-plain")]
        if layout == "native":  # against the fused variant of the same precision, where it ran
            fused = f"fused-eager-{name.split('-')[2]}"
            others += [r for r in plain if r["variant"] == fused]
        per_variant[name] = ratios(chosen + others, slo_p99_ms=SLO_P99_MS)
    return per_variant


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    load = pinned_load(args)
    levels = [LoadLevel("concurrency", float(c)) for c in args.concurrency.split(",")]
    run = make_random_run(args.work / f"run-{args.items}", num_items=args.items)
    histories = synthetic_histories(args.items, count=2000, min_length=5, max_length=60)
    table = variants(args.instances, args.delay_us, args.device)
    if args.export_report:
        from recserve.export.parity_report import build_report

        device = "cuda" if args.device == "gpu" else "cpu"
        build_report(
            run, args.out / "export-report", device, seconds=0.5, backends=tuple(args.export_report.split(","))
        )
    rows, notes, checks, overheads, steps = [], {}, {}, {}, {}
    chosen_variants = list(filter(None, args.variants.split(",")))
    store = args.work / "store"  # recserve's embedded store, for the variants by session and for hidden items
    by_session = any("layouts" in table[name] for name in chosen_variants) or bool(load.rules)
    if by_session:
        embedded_store.start(store)
    (args.work / STORED_RULES).write_text("bench_category = 'category == \"c03\"'\n")  # the rule --rules may name
    for name in chosen_variants:
        started = time.time()
        try:
            summary = run_variant(name, table[name], args, load, levels, histories, run, store)
        except Exception as err:  # keep going: one variant's failure is a finding, not the end of the run
            log.exception("variant %s failed", name)
            notes[name] = f"failed: {err}"
            continue
        rows += [row | {"variant": name, "model": "random"} for row in summary["results"]]
        for found, key in ((checks, "native_vs_fused"), (overheads, "rule_overhead"), (steps, "rule_steps")):
            if summary.get(key):
                found[name] = summary[key]
        notes[name] = f"ok in {time.time() - started:.0f} s" + (
            f"; stopped at {summary['stopped']}" if summary.get("stopped") else ""
        )
        log.info("%s done", name)
    if args.ml100k:
        rows += ml100k_rows(args, load, table["echo"]["settings"])
    if by_session:
        embedded_store.stop(store)
    per_variant = variant_ratios(rows, table, load.protocols()[0])
    result = {
        "gpu": gpu_name(),
        "host": describe(gpu_name()),  # the server path's cost follows the host's CPU
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["benchmarks/serving_layouts.py", *sys.argv[1:]]),
        "model": f"BERT4Rec, {args.items:,} items, hidden 256, 2 layers, 4 heads, window 40, random weights",
        "settings": {
            "instances": args.instances,
            "max_queue_delay_microseconds": args.delay_us,
            "measurement_ms": load.measurement_ms,
            "protocol": load.protocol,
            "perf_analyzer": f"--async --max-threads {load.client_threads}"
            + (
                f", pinned to cores {','.join(map(str, load.client_cpus))}, the server on the others"
                if load.client_cpus
                else ""
            ),
            "layouts": sorted({r["variant"] for r in rows}),
            "requests_from": "synthetic Zipf histories" + (", and ML-100K's test histories" if args.ml100k else ""),
            "slo_p99_ms": load.slo_p99_ms,
        },
        "results": rows,
        "ratios": per_variant,
        "native_checks": checks,
        "rule_overhead_by_variant": overheads,
        **({"rule_steps_by_variant": steps} if steps else {}),
        "notes": notes,
    }
    write_result(result, args.out)


def write_result(result: dict, out: Path) -> None:
    """summary.json, report.md (the first variant's ratios, and the native answers' checks), and the notes."""
    (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    per_variant, checks = result["ratios"], result["native_checks"]
    first = next(iter(per_variant.values()), ratios(result["results"], SLO_P99_MS))
    write_report(result | {"ratios": first}, out / "report.md")
    with (out / "report.md").open("a") as report:
        report.write("\n## Native answers against fused (eager, the same precision, the same repository)\n\n")
        for name, check in checks.items():
            report.write(f"- {name}: {json.dumps(check)}\n")
    summary = {"notes": result["notes"], "ratios": per_variant, "native_checks": checks}
    print(json.dumps(summary | {"rules": result["rule_overhead_by_variant"]}, indent=1))


if __name__ == "__main__":
    main()
