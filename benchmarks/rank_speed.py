"""The leave-one-out ranking's speed at catalogue scale: a SASRec with random weights (its speed is a trained
one's) ranks a generated log's test targets under every protocol and under `full` alone, at several
batch budgets (``SCORES_PER_BATCH``: users x catalogue scores a batch). Printed and written as JSON.

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
from recserve.train.leave_one_out import PROTOCOLS, Ranker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=200_000)
    parser.add_argument("--budgets", default="27,28,29", help="log2 of the scores a batch")
    parser.add_argument("--device", default="cuda")
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
    rows = []
    with torch.no_grad():
        ranker.ranks(model, PROTOCOLS, (0, 2_000))  # warm-up
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
                        "seconds": round(time.perf_counter() - started, 3),
                        "users": len(ranks["full"]),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    settings = {"items": args.items, "users": args.users, "device": device, "model": "SASRec, random weights"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": settings, "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
