"""What a run's speed depends on, measured while it trains: each epoch's training time (validation excluded) and
steps, the GPU's busy share and peak memory, and the host's CPU and GPU. `recserve train` records the last
epoch's in metrics.json (``speed``), benchmarks/train_scale.py every epoch's: a step bound by launching
kernels follows the host's CPU, so a figure without its host cannot be compared."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time

import torch
from lightning.pytorch.callbacks import Callback

from recserve.host import describe as host_of


def host() -> dict:
    """The host a run trained on: its CPU, the cores this process may use, and its GPU where it has one."""
    return host_of(torch.cuda.get_device_name() if torch.cuda.is_available() else None)


class BusySampler:
    """The GPU's utilisation (the share of time a kernel runs), sampled every ``period_s`` in a thread through
    NVML, or nvidia-smi where Python has no NVML binding."""

    def __init__(self, period_s: float = 0.1):
        self.period_s, self._stop = period_s, threading.Event()
        self.samples: list[float] = []
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
        return sum(self.samples) / len(self.samples) if self.samples else None

    def _run(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            read = lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu  # noqa: E731
        except Exception:  # no NVML binding: ask nvidia-smi, where there is one
            if not shutil.which("nvidia-smi"):
                return
            index = str(torch.cuda.current_device())
            query = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", index]
            read = lambda: float(subprocess.run(query, capture_output=True, text=True).stdout.split()[0])  # noqa: E731
        while not self._stop.wait(self.period_s):
            try:
                self.samples.append(read())
            except (ValueError, IndexError, OSError):  # a reading lost; the others stand
                continue


class EpochMeter(Callback):
    """Times each epoch's training (validation excluded) and, on a GPU, samples its busy share and peak memory."""

    def __init__(self):
        self.epochs: list[dict] = []
        self.sampler = BusySampler()
        self.gpu = False
        self.started: float | None = None  # the epoch's start, while one trains

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.gpu = pl_module.device.type == "cuda"
        if self.gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.sampler.start()
        self.started, self.steps = time.perf_counter(), 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps += 1

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or self.started is None:
            return
        if self.gpu:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - self.started
        busy = self.sampler.stop() if self.gpu else None
        peak = torch.cuda.max_memory_allocated() / 2**30 if self.gpu else None
        self.epochs.append({"train_s": seconds, "steps": self.steps, "gpu_busy_pct": busy, "peak_gpu_mem_gb": peak})
        self.val_started = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.epochs and "val_s" not in self.epochs[-1]:
            self.epochs[-1]["val_s"] = time.perf_counter() - self.val_started

    def on_train_end(self, trainer, pl_module) -> None:
        if self.gpu:  # a budget's end mid-epoch: the sampling stops too (stopping twice is harmless)
            self.sampler.stop()

    def summary(self) -> dict:
        """The last whole epoch's figures (metrics.json's ``speed``): seconds, steps a second, GPU busy share and
        peak memory (None on CPUs), and the host."""
        last = self.epochs[-1] if self.epochs else None
        if last is None:
            return {"host": host()}
        return {
            "epoch_s": round(last["train_s"], 2),
            "steps_per_s": round(last["steps"] / last["train_s"], 1) if last["train_s"] else None,
            "gpu_busy_pct": None if last["gpu_busy_pct"] is None else round(last["gpu_busy_pct"], 1),
            "peak_gpu_mem_gb": None if last["peak_gpu_mem_gb"] is None else round(last["peak_gpu_mem_gb"], 2),
            "epochs_measured": f"the last of {len(self.epochs)}",
            "host": host(),
        }
