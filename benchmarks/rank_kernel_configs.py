"""The ranking kernels' tile settings compared on one GPU: for each of --configs (BLOCK/BLOCK_K/warps/stages, and
optionally /programs a multiprocessor)
and each precision, the count of --users users against --items items (hidden --hidden) timed, the pair
kernel's scores of the targets checked against the count's own, and the counts of settings with the same
BLOCK_K (the same order of sums) compared. Printed and written as JSON; the fastest is what
`recserve.train.rank_kernels` should default to.

    python benchmarks/rank_kernel_configs.py --out runs/rank-kernel-configs.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import recserve.train.rank_kernels as kernels
from recserve.train.epoch_meter import host


def time_count(
    scores: kernels.TileScores, target: torch.Tensor, mask_index: int, rounds: int
) -> tuple[float, torch.Tensor]:
    """The median seconds of a count (its compile discarded), and the count."""
    above = scores.tally(target, mask_index)[1]
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        started = time.perf_counter()
        scores.tally(target, mask_index)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2], above


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--configs",
        default="128/32/8/3,128/64/8/3,128/32/4/3,128/64/4/3,128/32/8/4,128/64/8/2,64/32/4/3,64/64/4/3,64/64/4/4",
        help="BLOCK/BLOCK_K/warps/stages[/programs a multiprocessor], comma-separated",
    )
    parser.add_argument("--precisions", default="split,tf32x3,ieee")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    generator = torch.Generator("cuda").manual_seed(0)
    query = torch.nn.functional.layer_norm(
        torch.randn(args.users, args.hidden, device="cuda", generator=generator), (args.hidden,)
    )
    table = torch.randn(args.items + 2, args.hidden, device="cuda", generator=generator) * 0.1
    bias = torch.randn(args.items + 2, device="cuda", generator=generator) * 0.1
    target = torch.randint(1, args.items + 1, (args.users,), device="cuda", generator=generator)
    mask_index = args.items + 1
    rows, counts = [], {}
    default_programs = kernels.PROGRAMS_PER_SM
    for precision in args.precisions.split(","):
        for config in args.configs.split(","):
            kernels.PROGRAMS_PER_SM = default_programs  # unless the setting names its own
            try:
                kernels.use_setting(config)
            except ValueError as err:
                parser.error(f"--configs {err}")
            kernels.TileScores.precision, kernels.TileScores.count_stages = precision, None
            scores = kernels.TileScores(query, table, bias)
            try:
                seconds, above = time_count(scores, target, mask_index, args.rounds)
            except Exception as err:  # a setting that does not compile here is reported, not fatal
                rows.append({"config": config, "precision": precision, "error": str(err)[:200]})
                print(json.dumps(rows[-1]), flush=True)
                continue
            key = (precision, kernels.BLOCK_K)
            alike = float((above == counts[key]).float().mean()) if key in counts else 1.0
            counts.setdefault(key, above)
            rows.append(
                {
                    "config": config,
                    "precision": precision,
                    "seconds": round(seconds, 4),
                    "tera_scores_per_s": round(args.users * (args.items + 2) / seconds / 1e12, 3),
                    "counts_alike_same_block_k": alike,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    settings = vars(args) | {"out": str(args.out), "device": torch.cuda.get_device_name(0), "host": host()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": settings, "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
