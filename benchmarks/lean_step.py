"""A sampled SASRec step and a test ranking at catalogue scale: this checkout against another, alternating.

In a fresh process per checkout and repeat: one SASRec training step (batch, sampled loss, backward) on a
generated log of ``--items`` items, timed over ``--steps`` steps after one of warm-up, with the largest
tensor any operation made (a dispatch mode that sees every one) and the process's peak resident memory;
then every protocol of the leave-one-out ranking of ``--users`` users, timed. On a GPU the peak allocated
memory is read too. Each row of the JSON is one process; the summary gives the median ratios.

    python benchmarks/lean_step.py --other /tmp/old/src --out benchmarks/results/train-scale/cpu-2core-lean.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

PROGRAM = """
import json, resource, sys, time
import numpy as np, torch
from torch.utils._python_dispatch import TorchDispatchMode
from recserve.models import SASRec, SASRecConfig
from recserve.train.batches import NextItemSettings, WindowEpochs
from recserve.train.train_config import LossSettings
from recserve.train.leave_one_out import PROTOCOLS, Ranker
from recserve.train.losses import CatalogueLoss
from recserve.train.objectives import next_item_loss

items, users, batch, steps, device = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.manual_seed(0)
try:
    from recserve.bench.synthetic import zipf_sequences
    seq = zipf_sequences(users, items, 50)
except ImportError:  # an older checkout: the same log drawn here
    from recserve.data.sequences import Sequences
    rng = np.random.default_rng(0)
    lengths = rng.poisson(50, users).clip(5)
    ranks = ((((items + 1) ** 0.2 - 1) * rng.random(lengths.sum()) + 1) ** 5).astype(np.int64) - 1
    seq = Sequences(rng.permutation(items)[np.minimum(ranks, items - 1)] + 1, np.concatenate([[0], np.cumsum(lengths)]))
model = SASRec(SASRecConfig(num_items=items, window=100, dropout=0.2)).to(device)
loss = CatalogueLoss(LossSettings("sampled-uniform"), np.ones(items + 2), items + 1, device)
batches = iter(WindowEpochs(seq, NextItemSettings(100), batch, 1, seed=0, device=device))
gen = torch.Generator(device).manual_seed(0)
table = {(items + 2, 64), (items + 2,)}

class Largest(TorchDispatchMode):
    largest = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and tuple(t.shape) not in table:
                Largest.largest = max(Largest.largest, t.numel())
        return out

def step(b):
    with torch.autocast(device, torch.bfloat16, enabled=device == "cuda"):
        value = next_item_loss(model, b, loss, loss.draw(gen))
    value.backward()
    model.zero_grad(set_to_none=True)

with Largest():
    step(next(batches))
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
if device == "cuda":
    torch.cuda.reset_peak_memory_stats()
times = []
for _ in range(steps):
    b = next(batches)
    sync(); started = time.perf_counter(); step(b); sync()
    times.append(time.perf_counter() - started)
peak_gpu = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
model.eval()
inputs, targets = seq.truncated(1), seq.last(1)
ranker = Ranker(inputs, targets, np.bincount(inputs.items, minlength=items + 2), 100, items + 1, device=device)
with torch.no_grad():
    sync(); started = time.perf_counter(); ranker.ranks(model, PROTOCOLS); sync()
rank_s = time.perf_counter() - started
print(json.dumps({
    "step_s": float(np.median(times)), "largest_tensor": Largest.largest,
    "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "peak_gpu_gb": peak_gpu,
    "rank_s": rank_s, "protocols": list(PROTOCOLS), "positions": int(b.targets.numel()),
}))
"""


def run(src: str, args) -> dict:
    cmd = [sys.executable, "-c", PROGRAM, str(args.items), str(args.users), str(args.batch_size), str(args.steps)]
    result = subprocess.run(
        [*cmd, args.device], capture_output=True, text=True, env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"}
    )
    if result.returncode:
        raise SystemExit(f"{src}: {result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--other", required=True, help="the other checkout's src folder")
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=2_000, help="users in the log, and ranked")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = []
    for repeat in range(args.repeats):
        for name, src in (("this", str(SRC)), ("other", args.other)):
            rows.append({"checkout": name, "src": src, "repeat": repeat, **run(src, args)})
            print(json.dumps(rows[-1]), flush=True)
    summary = {}
    for key in ("step_s", "largest_tensor", "peak_rss_gb", "peak_gpu_gb", "rank_s"):
        this = [r[key] for r in rows if r["checkout"] == "this" and r[key] is not None]
        other = [r[key] for r in rows if r["checkout"] == "other" and r[key] is not None]
        if this and other:
            summary[key] = {"this": statistics.median(this), "other": statistics.median(other)}
            summary[key]["other_over_this"] = round(summary[key]["other"] / summary[key]["this"], 2)
    settings = {k: getattr(args, k) for k in ("items", "users", "batch_size", "steps", "repeats", "device")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": settings, "summary": summary, "rows": rows}, indent=2) + "\n")
    for key, value in summary.items():
        print(f"{key}: this {value['this']:.4g}, other {value['other']:.4g} ({value['other_over_this']}x)")


if __name__ == "__main__":
    main()
