"""Keeps a running Triton up: counts its python model processes (Triton 2.51 neither restarts one that dies
nor reaps it) and restarts the whole server when one is gone."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from recserve.processes import child_pids, cmdline, proc_name, proc_stat
from recserve.serving.triton_server.launcher import TritonServer

log = logging.getLogger(__name__)


def stub_count(server: TritonServer) -> int:
    """Live python-backend stub processes of this server (one per python model instance)."""
    if server.process is None or server.process.poll() is not None:
        return 0
    return sum(b"triton_python_backend_stub" in cmdline(pid) for pid in child_pids(server.process.pid))


def dead_stubs(server: TritonServer) -> int:
    """Python-backend stubs of this server that died and were not reaped (zombies: Triton 2.51 keeps them)."""
    if server.process is None or server.process.poll() is not None:
        return 0
    dead = 0
    for pid in child_pids(server.process.pid):
        fields = proc_stat(pid)
        dead += fields is not None and fields[0] == "Z" and proc_name(pid).startswith("triton_python")
    return dead


def supervise(
    server: TritonServer,
    stop: threading.Event,
    watch_secs: float,
    ready_timeout_s: float = 300,
    report: Callable[[str], None] = log.warning,
) -> int | None:
    """Keeps the server up until ``stop`` is set; returns its exit code if it exits on its own first.

    Every ``watch_secs`` (0: never) it counts the python model processes; one that died (Triton 2.51 does
    not restart it) restarts the whole server, told through ``report``. With model control ``none`` any process
    fewer counts; with ``poll`` or ``explicit``, where unloading a version ends its processes on purpose (and
    Triton reaps them), only a process that died and was left unreaped.
    """
    stubs, next_check = stub_count(server), time.monotonic() + watch_secs
    steady = server.settings.model_control_mode == "none"  # else a version's unload ends its processes on purpose
    while not stop.wait(0.5):
        if (code := server.exit_code()) is not None:
            return code
        if not watch_secs or time.monotonic() < next_check:
            continue
        if not steady:
            server.seal()  # models loaded since (poll, explicit): their shared memory their owner's alone
        alive, dead = stub_count(server), dead_stubs(server)
        lost = max(stubs - alive, dead) if steady else dead  # an unload reaps its processes; a crash leaves one
        if lost:
            report(f"{lost} model process(es) died: restarting the server")
            report(f"recovered in {server.restart(ready_timeout_s):.1f} s")
            alive = stub_count(server)
        stubs, next_check = alive, time.monotonic() + watch_secs
    return None


def serve_until_signalled(
    server: TritonServer,
    watch_secs: float,
    ready_timeout_s: float,
    ready: Callable[[], None],
    report: Callable[[str], None] = log.warning,
    failed: Callable[[str], None] | None = None,
    starting: AbstractContextManager | None = None,
) -> int:
    """Serves until SIGINT or SIGTERM, as `recserve serve` does in the foreground and detached: starts the
    server (inside ``starting``: a progress line), calls ``ready()`` once every model is, keeps it up
    (``supervise``, restarts told through ``report``), then stops it letting in-flight requests finish.

    Returns:
        The exit status for the caller: 0 for a clean stop, 1 where tritonserver exited on its own (told
        through ``failed``, with the log lines that say why) or did not stop cleanly.

    Raises:
        ServingError: the server exited or was not ready within ``ready_timeout_s`` at the start.
    """
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with starting or nullcontext():
        server.start()
        server.wait_ready(ready_timeout_s)
    ready()
    exited = supervise(server, stop, watch_secs, ready_timeout_s, report=report)
    if exited is not None:
        (failed or report)(f"tritonserver exited with code {exited}\n{server.failure_summary()}")
        return 1
    report("stopping: letting in-flight requests finish")
    code = server.stop()
    return 0 if code in (0, None, -signal.SIGTERM) else 1
