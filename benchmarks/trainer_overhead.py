"""The host's work a step in `recserve train` itself, with a model so small that the host bounds the step.

Each repeat trains BERT4Rec (window 4, hidden 8, one layer and head, no dropout) for three epochs through
`recserve.train.trainer.train`: the first warms up, the second is timed (ms a step), the third runs under
cProfile (Python calls a step: the same from run to run, so a change's effect shows without the machine's
noise). One JSON file: {"device", "settings", "repeats": [...], "median_ms_a_step", "python_calls_a_step"}.

    python benchmarks/trainer_overhead.py --out benchmarks/results/train-scale/cpu-2core-trainer-overhead.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from recserve.data.datasets import prepare
from recserve.train.trainer import TrainConfig, train

MODEL = {"window": 4, "hidden": 8, "dropout": 0.0, "layers": 1, "heads": 1}


class EpochProbe(Callback):
    """Times the second epoch and profiles the third."""

    def on_train_epoch_start(self, trainer, module) -> None:
        if trainer.current_epoch == 2:
            self.profile = cProfile.Profile()
            self.profile.enable()
        self.started = time.perf_counter()

    def on_train_epoch_end(self, trainer, module) -> None:
        seconds = time.perf_counter() - self.started
        steps = trainer.num_training_batches
        if trainer.current_epoch == 1:
            self.ms_a_step = 1000 * seconds / steps
        if trainer.current_epoch == 2:
            self.profile.disable()
            self.calls_a_step = pstats.Stats(self.profile).total_calls / steps  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--data", help="a prepared folder (`recserve data`); ML-100K by default")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="trainer-overhead-"))
    data = args.data
    if data is None:
        prepare("ml-100k", work / "data")
        data = str(work / "data")
    cfg = TrainConfig(epochs=3, batch_size=args.batch_size, samples_per_user=4, device=args.device, patience=100)
    repeats = []
    for repeat in range(args.repeats):
        probe = EpochProbe()
        train(data, work / "run", MODEL, cfg, overwrite=True, callbacks=[probe])
        repeats.append({"ms_a_step": round(probe.ms_a_step, 3), "python_calls_a_step": round(probe.calls_a_step)})
        print(f"repeat {repeat}: {probe.ms_a_step:.2f} ms a step, {probe.calls_a_step:,.0f} Python calls a step")
    cpu = f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
    settings = {"data": args.data or "ml-100k", "model": MODEL, "batch_size": args.batch_size, "threads": args.threads}
    result = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else cpu,
        "settings": settings,
        "repeats": repeats,
        "median_ms_a_step": statistics.median(r["ms_a_step"] for r in repeats),
        "python_calls_a_step": statistics.median(r["python_calls_a_step"] for r in repeats),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"median {result['median_ms_a_step']:.2f} ms a step, {result['python_calls_a_step']:,} Python calls a step")


if __name__ == "__main__":
    main()
