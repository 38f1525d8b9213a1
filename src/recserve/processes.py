"""Linux process and port helpers for the servers recserve starts: their exit codes, free loopback ports, /proc
children and command lines, and tying a child's life to its parent's."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import subprocess
from pathlib import Path

from recserve.errors import ServingError


def exit_code(process: subprocess.Popen | None, what: str) -> int | None:
    """None while ``process`` runs, its exit code once it has exited.

    Raises:
        ServingError: it was never started (``what`` names it: "the server").
    """
    if process is None:
        raise ServingError(f"{what} was never started")
    return process.poll()


def free_ports(count: int) -> list[int]:
    """Ports that are free on loopback right now (for tests and benchmarks that start their own server)."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state, ppid, ...), or None when it is gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_name(pid: int) -> str:
    """The command name of ``/proc/PID/stat`` (what the kernel keeps, at most 15 characters), "" when gone."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return ""
    return stat[stat.find("(") + 1 : stat.rfind(")")]


def child_pids(pid: int) -> list[int]:
    """The direct children of a process (Linux /proc)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := proc_stat(int(entry.name))) is not None and int(fields[1]) == pid:
            children.append(int(entry.name))
    return children


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def stop_with_parent() -> None:
    """In the child before exec: SIGTERM the server when the process that started it dies (Linux)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def seal_shared_memory(pid: int) -> int:
    """Makes the shared-memory regions that ``pid``'s child processes map (Triton's python-backend stubs: their
    requests and answers pass through them) readable by their owner only; returns how many it changed. The
    python backend creates them 0644 whatever the umask, before any request reaches them."""
    changed = 0
    for child in child_pids(pid):
        try:
            maps = Path(f"/proc/{child}/maps").read_text().splitlines()
        except OSError:
            continue
        for region in {line.split(None, 5)[5] for line in maps if len(line.split(None, 5)) == 6}:
            path = Path(region)
            if path.parent != Path("/dev/shm"):
                continue
            with contextlib.suppress(OSError):
                if path.stat().st_mode & 0o077:
                    path.chmod(0o600)
                    changed += 1
    return changed
