"""The machine a figure was measured on: a step bound by launching kernels, or a server's own path, follows
the host's CPU, so every recorded speed carries it (`recserve train`'s metrics.json, `recserve bench`'s
summary.json, the benchmarks' JSON)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The host CPU's model name (Linux's /proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(gpu: str | None = None) -> dict:
    """The host: its CPU, the cores this process may use, and ``gpu`` (the device's name) where one ran."""
    return {"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)), "gpu": gpu}
