"""A training step of `recserve train`'s defaults on the CPU: this checkout against another, alternating.

Each repeat runs, in a fresh process per checkout, the model's step (batch, loss, backward, AdamW) on a
prepared folder for ``--steps`` steps after two of warm-up, the checkouts in turn, so the machine's drift
falls on both. Writes the seconds a step per repeat and the median ratio.

    python benchmarks/cpu_step.py --data runs/ml100k --other /tmp/old-checkout/src --out step.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

STEP = """
import sys, time, torch
from recserve.data.datasets import load_prepared
from recserve.train.lightning_modules import build_task
from recserve.train.batches import ClozeSettings, NextItemSettings, WindowEpochs
from recserve.models.model_configs import Bert4RecConfig
try:
    from recserve.train.train_config import MODEL_DEFAULTS, TrainConfig
except ImportError:  # checkouts before train/train_config.py
    from recserve.train.trainer import MODEL_DEFAULTS, TrainConfig
model, data_dir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.manual_seed(0)
cfg = TrainConfig(**MODEL_DEFAULTS[model], device="cpu")
module = build_task(model, load_prepared(data_dir), {}, cfg).module
module.setup("fit")
module.generator = torch.Generator().manual_seed(0)
c = module.model_cfg
settings = (ClozeSettings(c.window, c.mask_index, c.mask_prob, cfg.last_item_rate) if isinstance(c, Bert4RecConfig)
            else NextItemSettings(c.window))
batches = iter(WindowEpochs(module.train_seq, settings, cfg.batch_size, 64, 0, torch.device("cpu"), 0, 1))
opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
def step(batch):
    negatives = module.catalogue_loss.draw(module.generator)
    loss = module.step_loss(module.model, batch, module.catalogue_loss, negatives)
    opt.zero_grad(); loss.backward(); opt.step()
for _ in range(2):
    step(next(batches))
work = [next(batches) for _ in range(steps)]
started = time.perf_counter()
for batch in work:
    step(batch)
print((time.perf_counter() - started) / steps)
"""


def time_step(src: str, model: str, data: str, steps: int) -> float:
    env = os.environ | {"PYTHONPATH": src}
    command = [sys.executable, "-c", STEP, model, data, str(steps)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{src}: {done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a prepared folder (`recserve data`)")
    parser.add_argument("--other", required=True, help="the other checkout's src folder")
    parser.add_argument("--models", default="sasrec,bert4rec")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result: dict = {"data": args.data, "steps": args.steps, "threads": os.cpu_count(), "models": {}}
    for model in args.models.split(","):
        this, other = [], []
        for _ in range(args.repeats):
            other.append(time_step(args.other, model, args.data, args.steps))
            this.append(time_step(str(SRC), model, args.data, args.steps))
        ratios = [o / t for o, t in zip(other, this)]
        result["models"][model] = {
            "step_s_this": this,
            "step_s_other": other,
            "speedup_median": round(statistics.median(ratios), 3),
        }
        print(
            f"{model}: {statistics.median(other):.3f} -> {statistics.median(this):.3f} s a step, "
            f"{statistics.median(ratios):.2f}x (median of {args.repeats} alternating pairs)"
        )
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
