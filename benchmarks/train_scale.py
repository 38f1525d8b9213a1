"""Training and evaluation speed at catalogue scale, through `recserve train` itself.

For each setting a Zipf-like log is generated (prepare_large.py's generator), prepared with `recserve data`,
and trained for ``--epochs`` epochs (early stopping off). The last epoch is measured: training windows/s
and seconds (validation excluded), the GPU's busy share sampled through NVML (or nvidia-smi) every 100 ms
while it trains, and peak GPU memory. Then the test split is ranked under every protocol (`recserve
evaluate`'s code) and timed. One JSON file: {"device": ..., "results": [one object per setting]}.

    python benchmarks/train_scale.py --out benchmarks/results/train-scale/h200.json --device cuda
    python benchmarks/train_scale.py --out benchmarks/results/train-scale/cpu-2core.json --device cpu \\
        --sizes 10000:10000,100000:10000,1000000:10000 --batch-size 128
    python benchmarks/train_scale.py --out video.json --device cuda --video ../shared/data/video.txt

A setting is ITEMS:USERS (ITEMS:USERS:LOSS to name a loss; else --loss).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_large import generate  # noqa: E402

from recserve.data.datasets import PrepareOptions, load_prepared, prepare  # noqa: E402
from recserve.train.evaluate import evaluate_run  # noqa: E402
from recserve.train.trainer import TrainConfig, train  # noqa: E402


class BusySampler:
    """The GPU's utilisation (the share of time a kernel runs), sampled every ``period_s`` in a thread."""

    def __init__(self, period_s: float = 0.1):
        self.period_s, self.samples, self._stop = period_s, [], threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> float | None:
        """Stops sampling; the mean busy percentage, or None where no GPU could be read."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return float(np.mean(self.samples)) if self.samples else None

    def _run(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            read = lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu  # noqa: E731
        except Exception:  # no NVML binding: ask nvidia-smi, where there is one
            if not shutil.which("nvidia-smi"):
                return
            query = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", "0"]
            read = lambda: float(subprocess.run(query, capture_output=True, text=True).stdout.split()[0])  # noqa: E731
        while not self._stop.wait(self.period_s):
            self.samples.append(read())


class EpochMeter(Callback):
    """Times each epoch's training (validation excluded) and samples the GPU while it runs."""

    def __init__(self):
        self.epochs: list[dict] = []
        self.sampler = BusySampler()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.sampler.start()
        self.started, self.steps = time.perf_counter(), 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps += 1

    def on_validation_start(self, trainer, pl_module) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds = time.perf_counter() - self.started
        busy = self.sampler.stop()
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
        self.epochs.append({"train_s": seconds, "steps": self.steps, "gpu_busy_pct": busy, "peak_gpu_mem_gb": peak})
        self.val_started = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        self.epochs[-1]["val_s"] = time.perf_counter() - self.val_started


def run_setting(data_dir: Path, run_dir: Path, cfg: TrainConfig, model_overrides: dict) -> dict:
    meter = EpochMeter()
    summary = train(data_dir, run_dir, model_overrides, cfg, callbacks=[meter], overwrite=True)
    data = load_prepared(data_dir)
    windows = int((data.train.lengths > 0).sum()) * cfg.samples_per_user
    last = meter.epochs[-1]
    evaluated = evaluate_run(run_dir, data_dir, device="cuda" if cfg.accelerator == "gpu" else "cpu")
    return {
        "items": int(data.vocab.num_items),
        "users": int(data.sequences.num_users),
        "interactions": int(len(data.sequences.items)),
        "loss": summary["loss"]["name"],
        "loss_settings": summary["loss"],
        "batch_size": cfg.batch_size,
        "precision": cfg.lightning_precision,
        "compile": cfg.compile,
        "windows": windows,
        "windows_per_s": round(windows / last["train_s"]),
        "epoch_s": round(last["train_s"], 2),
        "val_s": round(last.get("val_s", float("nan")), 3),
        "eval_s": evaluated["eval"]["seconds"],
        "eval_protocols": evaluated["eval"]["protocols"],
        "peak_gpu_mem_gb": None if last["peak_gpu_mem_gb"] is None else round(last["peak_gpu_mem_gb"], 2),
        "gpu_busy_pct": None if last["gpu_busy_pct"] is None else round(last["gpu_busy_pct"], 1),
        "epochs_measured": "the last of %d" % len(meter.epochs),
        "every_epoch": meter.epochs,
        "test_full_ndcg@10": evaluated["test"]["full"]["ndcg@10"],
        "popularity_full_ndcg@10": evaluated["popularity"]["full"]["ndcg@10"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--sizes", default="10000:100000,100000:200000,1000000:200000",
                        help="ITEMS:USERS[:LOSS] settings, comma-separated")
    parser.add_argument("--interactions-per-user", type=int, default=50)
    parser.add_argument("--video", help="time and rank video.txt (or another `user item` file) instead")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--epochs", type=int, default=2, help="the last one is measured")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--loss", default="auto")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--work", help="folder for data and runs (a temporary one by default)")
    args = parser.parse_args()
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU ({platform.processor() or 'x86_64'}, {torch.get_num_threads()} threads)"
    work = Path(args.work or tempfile.mkdtemp(prefix="train-scale-"))
    results = []
    settings = [("video", args.video, args.loss)] if args.video else [
        (f"{s.split(':')[0]}:{s.split(':')[1]}", s, s.split(":")[2] if s.count(":") == 2 else args.loss)
        for s in args.sizes.split(",")]
    for name, spec, loss in settings:
        data_dir = work / f"data-{name.replace(':', '-')}"
        if args.video:
            prepare(spec, data_dir, PrepareOptions(min_user_interactions=3))
        else:
            items, users = (int(x) for x in spec.split(":")[:2])
            log = work / "log.parquet"
            generate(log, users * args.interactions_per_user, users, items)
            prepare(str(log), data_dir)
        cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, patience=args.epochs + 1, device=args.device,
                          loss=loss, compile=args.compile, resume=False)
        started = time.perf_counter()
        result = run_setting(data_dir, work / f"run-{name.replace(':', '-')}", cfg,
                             {"window": args.window, "hidden": args.hidden})
        result["setting"], result["wall_s"] = name, round(time.perf_counter() - started, 1)
        results.append(result)
        print(f"{name}: {result['items']:,} items, {result['users']:,} users, loss {result['loss']}: "
              f"{result['windows_per_s']:,} windows/s, epoch {result['epoch_s']} s, eval {result['eval_s']} s, "
              f"peak {result['peak_gpu_mem_gb']} GB, GPU busy {result['gpu_busy_pct']}%", flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"device": device_name, "command": " ".join(sys.argv),
                                              "torch": torch.__version__, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
