"""The leave-one-out ranking's speed at catalogue scale: a SASRec with random weights (its speed is a trained
one's) ranks a generated log's test targets under every protocol and under `full` alone, each of --ways
(the kernels' tiled count; dense scores at several batch budgets, ``SCORES_PER_BATCH``: users x catalogue
scores a batch, compiled or plain), and how many users' ranks each way gave alike; then where the time of
every protocol goes (the operations by GPU time, a profile of --profile-users users). Printed and written
as JSON.

    python benchmarks/rank_speed.py --items 1000000 --users 200000 --ways tiled,compiled --out runs/rank-speed.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

import recserve.train.leave_one_out as leave_one_out
import recserve.train.rank_kernels as rank_kernels
from recserve.bench.synthetic import zipf_sequences
from recserve.models import SASRec, SASRecConfig
from recserve.train.fused import GpuFused
from recserve.train.leave_one_out import PROTOCOLS, Ranker
from recserve.train.rank_kernels import TileScores


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


WAYS = {"tiled": (True, True), "compiled": (True, False), "plain": (False, False)}  # (GpuFused, TileScores)


def agreement(answers: dict) -> dict:
    """Per protocol, the least share of users whose rank a run gave as the first run of its protocols did."""
    shares: dict[str, float] = {}
    for runs in answers.values():
        for ranks in runs[1:]:
            for name, values in ranks.items():
                alike = float(np.mean(values == runs[0][name])) if len(values) else 1.0
                shares[name] = min(shares.get(name, 1.0), round(alike, 6))
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=200_000)
    parser.add_argument("--budgets", default="27,28,29", help="log2 of the scores a batch")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--profile-users", type=int, default=20_000, help="0: no profile")
    parser.add_argument(
        "--ways",
        default="tiled",
        help="some of: tiled (the kernels count, no scores in memory), compiled (dense scores, the count and "
        "draws compiled), plain (dense scores, plain operations); the dense ways at each of --budgets",
    )
    parser.add_argument(
        "--kernel-config",
        default="",
        help="the kernels' BLOCK/BLOCK_K/warps/stages[/programs a multiprocessor] (benchmarks/rank_kernel_configs.py); "
        "empty: recserve.train.rank_kernels' defaults",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.kernel_config:
        try:
            rank_kernels.use_setting(args.kernel_config)
        except ValueError as err:
            parser.error(f"--kernel-config {err}")
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
        for way in args.ways.split(","):
            GpuFused.enabled, TileScores.enabled = WAYS[way]
            tiled = leave_one_out.counts_tiled(model, torch.device(args.device))
            # warm-up: a whole ranking (on a GPU, compiling for each batch's shape: the full and the last)
            ranker.ranks(model, PROTOCOLS)
            for budget in [None] if tiled else [int(b) for b in args.budgets.split(",")]:
                if budget is not None:
                    leave_one_out.SCORES_PER_BATCH[torch.device(args.device).type] = 2**budget
                batch = leave_one_out.tiled_batch_size(model) if tiled else None
                for protocols in (PROTOCOLS, ("full",)):
                    sync()
                    started = time.perf_counter()
                    ranks = ranker.ranks(model, protocols)
                    sync()
                    rows.append(
                        {
                            "way": way if tiled or way != "tiled" else "compiled (no kernels here)",
                            "scores_per_batch": 2**budget if budget is not None else None,
                            "users_per_batch": batch or leave_one_out.eval_batch_size(args.items + 2, args.device),
                            "protocols": list(protocols),
                            "seconds": round(time.perf_counter() - started, 3),
                            "users": len(ranks["full"]),
                        }
                    )
                    print(json.dumps(rows[-1]), flush=True)
                    answers.setdefault(protocols, []).append(ranks)
        GpuFused.enabled, TileScores.enabled = True, True
        same = agreement(answers)
        print(f"ranks against the first run's, the share of users alike: {json.dumps(same)}")
        profile = profile_ranking(ranker, model, args.profile_users, sync) if args.profile_users else None
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    settings = {
        "items": args.items,
        "users": args.users,
        "device": device,
        "model": "SASRec, random weights",
        "kernel_config": rank_kernels.setting(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"settings": settings, "ranks_alike": same, "results": rows, "profile": profile}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
