"""Soak: a steady load for RECSERVE_SOAK_S seconds (60 in `make test`; 1800 for the documented long form).

Reports the memory of the server and its model processes at the start, the middle and the end, and the
error count (zero). A leak grows with the requests served, so the second half must not grow the memory by
more than 5% of the start (the first half may still settle), however fast a loaded machine serves.
Loopback only, a fixed number of client threads, bounded in time.
"""

import os
import threading
import time
from pathlib import Path

from recserve.client import RecommenderClient
from recserve.processes import child_pids
from recserve.serving.triton_server.launcher import TritonServer
from tests.conftest import server_settings

SOAK_S = float(os.environ.get("RECSERVE_SOAK_S", "60"))
WARMUP_S = 10.0
THREADS = 3


def _rss_mib(pid: int) -> float:
    """Resident memory of a process and its direct children (the model processes), in MiB."""
    total = 0
    for process in (pid, *child_pids(pid)):
        try:
            status = Path(f"/proc/{process}/status").read_text()
        except OSError:
            continue
        total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return total / 1024


def _load(url: str, seconds: float, counts: dict, lock: threading.Lock) -> None:
    client = RecommenderClient(url, "grpc", timeout_s=10)
    histories = [list(range(1 + i, 20 + i)) for i in range(50)]
    deadline, i = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        try:
            client.recommend(histories[i % len(histories)], k=10, exclude_seen=bool(i % 2))
            key = "ok"
        except Exception:
            key = "errors"
        with lock:
            counts[key] += 1
        i += 1


def _run(url: str, seconds: float) -> dict:
    counts, lock = {"ok": 0, "errors": 0}, threading.Lock()
    threads = [threading.Thread(target=_load, args=(url, seconds, counts, lock)) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts


def test_steady_load_keeps_memory_flat_and_errors_at_zero(int_repo, tmp_path):
    with TritonServer(int_repo, server_settings(), log_path=tmp_path / "server.log") as server:
        _run(server.grpc_url, WARMUP_S)  # caches, allocator pools and batch shapes settle first
        start_mib = _rss_mib(server.process.pid)
        first = _run(server.grpc_url, SOAK_S / 2)
        middle_mib = _rss_mib(server.process.pid)
        second = _run(server.grpc_url, SOAK_S / 2)
        end_mib = _rss_mib(server.process.pid)
    late = (end_mib - middle_mib) / start_mib
    print(
        f"soak: {SOAK_S:.0f} s, {first['ok'] + second['ok']} answered, {first['errors'] + second['errors']} errors; "
        f"server and model processes {start_mib:.0f} -> {middle_mib:.0f} -> {end_mib:.0f} MiB "
        f"(second half {late:+.1%} of the start)"
    )
    assert first["errors"] == second["errors"] == 0 and first["ok"] > 0 and second["ok"] > 0
    assert late < 0.05
