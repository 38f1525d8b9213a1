"""CPU time per request, by process, while a load runs: where a request's time goes on a shared host.

Reads Linux's ``/proc`` for the server and the model processes it started (the python-backend stubs), and
the finished children of this process (perf_analyzer) from ``getrusage``. Elsewhere it reports nothing.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

from recserve.processes import child_pids, proc_stat

PROC = Path("/proc")


def _cpu_seconds(pid: int) -> float | None:
    """CPU seconds a live process has used (user and system), or None when it is gone or unreadable."""
    fields = proc_stat(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuSnapshot:
    server_s: float
    models_s: dict[int, float]  # by pid: the server's children, its model processes
    client_s: float  # this process's finished children


class CpuMeter:
    """Snapshots of the CPU time of a server process tree and of finished client processes."""

    def __init__(self, server_pid: int | None):
        self.server_pid = server_pid if PROC.is_dir() else None

    def snapshot(self) -> CpuSnapshot | None:
        if self.server_pid is None or (server := _cpu_seconds(self.server_pid)) is None:
            return None
        stubs = {pid: _cpu_seconds(pid) for pid in child_pids(self.server_pid)}  # the model processes
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        models = {pid: seconds for pid, seconds in stubs.items() if seconds is not None}
        return CpuSnapshot(server, models, usage.ru_utime + usage.ru_stime)

    def per_request(self, before: CpuSnapshot | None, requests: int) -> dict | None:
        """Microseconds of CPU a request since ``before``: the client, the server and the model processes."""
        after = self.snapshot()
        if before is None or after is None or requests <= 0:
            return None
        models = sum(seconds - before.models_s.get(pid, 0.0) for pid, seconds in after.models_s.items())
        spent = {
            "client": after.client_s - before.client_s,
            "server": after.server_s - before.server_s,
            "models": models,
        }
        return {name: seconds / requests * 1e6 for name, seconds in spent.items()}
