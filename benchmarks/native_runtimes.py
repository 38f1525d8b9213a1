"""The native layout on its two TorchScript runtimes, one export, one host: Triton's PyTorch backend against
recserve's own (native/triton-backend), through perf_analyzer over gRPC, rounds alternating so that a shared
host's drift moves both sides. On GPUs recserve's backend replays CUDA graphs; on CPUs both run the same graph
operator by operator, so there the comparison is of the backends' own overhead.

One JSON file: {"device", "model", "settings", "rounds": [{runtime: row}], "median": {runtime: row},
"ratio_recserve_to_pytorch": {"throughput", "p50", "p99"}}; each row has Triton's per-step statistics.

    python benchmarks/native_runtimes.py --out benchmarks/results/cpu-2core-native/runtimes.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

from recserve.bench.load_settings import LoadSettings
from recserve.bench.perf_analyzer import LoadLevel
from recserve.bench.sweep import sweep
from recserve.bench.synthetic import make_random_run, synthetic_histories
from recserve.pipeline import repository_from_run
from recserve.serving.triton_repository.repository_settings import RepositorySettings

RUNTIMES = ("pytorch", "recserve")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--measurement-ms", type=int, default=3000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="native-runtimes-") as tmp:
        run = make_random_run(Path(tmp) / "run", num_items=args.items, hidden=args.hidden, heads=2, window=40)
        histories = synthetic_histories(args.items, count=2000, min_length=5, max_length=60)
        base = RepositorySettings(device=args.device, max_queue_delay_microseconds=0 if args.device == "cpu" else 300)
        repos = {}
        for runtime in RUNTIMES:  # one export's graph, the same file in both repositories
            repos[runtime] = Path(tmp) / f"repo-{runtime}"
            settings = dataclasses.replace(base, native_runtime=runtime)
            repository_from_run(run, repos[runtime], ("native", "fused"), settings, backend="torchscript")
        rounds = []
        for number in range(args.rounds):
            row = {}
            for runtime in RUNTIMES if number % 2 == 0 else RUNTIMES[::-1]:
                summary = sweep(
                    ["native"],
                    [LoadLevel("concurrency", float(args.concurrency))],
                    Path(tmp) / f"sweep-{runtime}-{number}",
                    histories,
                    repo=repos[runtime],
                    load=LoadSettings(measurement_ms=args.measurement_ms, compare_with_fused=number == 0),
                )
                row[runtime] = summary["results"][0] | {"native_vs_fused": summary.get("native_vs_fused")}
                print(runtime, f"round {number}: {row[runtime]['throughput_rps']:.0f} req/s", flush=True)
            rounds.append(row)
    keys = ("throughput_rps", "p50_ms", "p99_ms")
    median = {r: {k: statistics.median(x[r][k] for x in rounds) for k in keys} for r in RUNTIMES}
    result = {
        "device": f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "model": f"BERT4Rec, {args.items:,} items, hidden {args.hidden}, 2 layers, 2 heads, window 40, random weights",
        "settings": vars(args) | {"out": str(args.out), "protocol": "grpc", "export": "torchscript fp32"},
        "rounds": rounds,
        "median": median,
        "ratio_recserve_to_pytorch": {
            "throughput": median["recserve"]["throughput_rps"] / median["pytorch"]["throughput_rps"],
            "p50": median["recserve"]["p50_ms"] / median["pytorch"]["p50_ms"],
            "p99": median["recserve"]["p99_ms"] / median["pytorch"]["p99_ms"],
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median"], indent=1), json.dumps(result["ratio_recserve_to_pytorch"]))


if __name__ == "__main__":
    main()
