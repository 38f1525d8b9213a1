"""The leave-one-out ranking's speed at catalogue scale: a SASRec with random weights (its speed is a trained
one's) ranks a generated log's test targets under every protocol and under `full` alone, at several
batch budgets (``SCORES_PER_BATCH``: users x catalogue scores a batch), then, under the largest budget,
where the time of every protocol goes (the operations by GPU time, a profile of --profile-users users).
Printed and written as JSON.

    python benchmarks/rank_speed.py --items 1000000 --users 200000 --out runs/rank-speed.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

import recserve.train.leave_one_out as leave_one_out
from recserve.bench.synthetic import zipf_sequences
from recserve.models import SASRec, SASRecConfig
from recserve.train.fused import GpuFused
from recserve.train.leave_one_out import PROTOCOLS, Ranker


def profile_ranking(ranker: Ranker, model, users: int, sync) -> dict:
    """The operations of ranking ``users`` users under every protocol, by their own device time."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    sync()
    started = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        ranker.ranks(model, PROTOCOLS, (0, users))
        sync()
    wall_s = time.perf_counter() - started
    events = sorted(prof.key_averages(), key=lambda e: (-e.self_device_time_total, -e.self_cpu_time_total))[:15]
    ops = [
        {
            "name": e.key[:100],
            "device_ms": round(e.self_device_time_total / 1000, 2),
            "cpu_ms": round(e.self_cpu_time_total / 1000, 2),
            "calls": e.count,
        }
        for e in events
    ]
    device_ms = sum(e.self_device_time_total for e in prof.key_averages()) / 1000
    print(f"profile of {users:,} users: wall {wall_s:.3f} s (profiled), device {device_ms:.1f} ms; by device time:")
    for op in ops:
        print(f"  {op['device_ms']:9.2f} ms device {op['cpu_ms']:9.2f} ms host  x{op['calls']:<5d} {op['name']}")
    return {"users": users, "wall_s": round(wall_s, 3), "device_ms": round(device_ms, 1), "ops": ops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=200_000)
    parser.add_argument("--budgets", default="27,28,29", help="log2 of the scores a batch")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--profile-users", type=int, default=20_000, help="0: no profile")
    parser.add_argument(
        "--compare-plain",
        action="store_true",
        help="then again with the GPU's compiled count and draws off (the plain operations), and check the ranks agree",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    seq = zipf_sequences(args.users, args.items, 50)
    inputs, targets = seq.truncated(1), seq.last(1)
    torch.manual_seed(0)
    model = SASRec(SASRecConfig(num_items=args.items, window=100)).to(args.device).eval()
    model.prepare_inference()
    ranker = Ranker(
        inputs, targets, np.bincount(inputs.items, minlength=args.items + 2), 100, args.items + 1, args.device
    )
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    rows, answers = [], {}
    with torch.no_grad():
        for fused in (True, False) if args.compare_plain else (True,):
            GpuFused.enabled = fused
            ranker.ranks(model, PROTOCOLS, (0, 2_000))  # warm-up (and on a GPU, compiling)
            for budget in (int(b) for b in args.budgets.split(",")):
                leave_one_out.SCORES_PER_BATCH[torch.device(args.device).type] = 2**budget
                for protocols in (PROTOCOLS, ("full",)):
                    sync()
                    started = time.perf_counter()
                    ranks = ranker.ranks(model, protocols)
                    sync()
                    rows.append(
                        {
                            "scores_per_batch": 2**budget,
                            "users_per_batch": leave_one_out.eval_batch_size(args.items + 2, args.device),
                            "protocols": list(protocols),
                            "fused": fused,
                            "seconds": round(time.perf_counter() - started, 3),
                            "users": len(ranks["full"]),
                        }
                    )
                    print(json.dumps(rows[-1]), flush=True)
                    answers.setdefault(protocols, []).append(ranks)
        GpuFused.enabled = True
        same = all(all(np.array_equal(r[n], runs[0][n]) for n in runs[0]) for runs in answers.values() for r in runs)
        print(f"every run gave the same ranks: {same}")
        profile = profile_ranking(ranker, model, args.profile_users, sync) if args.profile_users else None
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    settings = {"items": args.items, "users": args.users, "device": device, "model": "SASRec, random weights"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"settings": settings, "same_ranks": same, "results": rows, "profile": profile}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
