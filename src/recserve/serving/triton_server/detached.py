"""Servers started with ``recserve serve --detach``, and the logs of every ``recserve serve``.

A detached server is a process of its own (``run_detached``: the Triton server on a repository, watched as
the foreground ``recserve serve`` watches it) that holds its HTTP port's lock (``servers/<http_port>.lock``,
one server a port) and writes its record once its own server is ready: recserve's cache folder,
``servers/<http_port>.json`` (its process with the process's start time, repository, addresses, logs and the
server ID its Triton answers with). A record names its server by identity, not by number: ``recserve status``
and ``recserve stop`` take a process for the record's only where its start time and command are the record's,
and a ready server for its own only where it answers with the record's server ID; ``stop`` signals nothing
else (SIGTERM: in-flight requests finish). The folder is the user's alone (0700, records and logs 0600). Each
start writes its logs under ``servers/logs/`` with the port and the time in their names, and the last
``LOGS_KEPT`` of each kind are kept.
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from recserve.errors import ServingError
from recserve.files import cache_dir, private_dir, write_private
from recserve.processes import cmdline, proc_stat

if TYPE_CHECKING:
    from recserve.serving.triton_server.launcher import ServerSettings

LOGS_KEPT = 20  # the logs of each kind kept (the newest)
SPEC_ENV = "RECSERVE_DETACHED_SPEC"  # what the detached process serves (JSON; in the environment, not argv)


DETACHED_MARK = b"run_detached"  # in a detached process's command line


def servers_dir() -> Path:
    return private_dir(cache_dir() / "servers")


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot: with the pid, a process's identity), or None."""
    stat = proc_stat(pid)
    return int(stat[19]) if stat is not None and len(stat) > 19 and stat[0] not in "ZX" else None


def new_log(kind: str, http_port: int) -> Path:
    """A fresh log file's path for a server on ``http_port`` (``kind``: triton, or serve for a detached
    process's own output), the older ones of that kind past ``LOGS_KEPT`` removed."""
    logs = private_dir(servers_dir() / "logs")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    older = sorted(logs.glob(f"{kind}-*.log"), key=lambda p: p.stat().st_mtime)
    for old in older[: max(0, len(older) - (LOGS_KEPT - 1))]:
        old.unlink(missing_ok=True)
    return logs / f"{kind}-{http_port}-{stamp}.log"


@dataclass(frozen=True)
class ServerRecord:
    """A detached server as its record holds it."""

    pid: int
    repo: str
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    triton_log: str
    log: str
    started: str
    server_id: str  # what its Triton answers with (`--id`, the server metadata's name)
    start_ticks: int  # when its process started (``start_ticks``)

    @property
    def path(self) -> Path:
        return servers_dir() / f"{self.http_port}.json"

    def alive(self) -> bool:
        """Whether the record's own process runs: its number, its start time and a detached server's command
        (never another process that took the number after it)."""
        return start_ticks(self.pid) == self.start_ticks and DETACHED_MARK in cmdline(self.pid)

    def ready(self) -> bool:
        """Whether its own server (its server ID, not any server on its port) says every model is ready."""
        from recserve.serving.triton_server.launcher import answers_ready

        return answers_ready(f"{self.host}:{self.http_port}", self.server_id)

    def status(self) -> dict:
        """The record, its state, and what it serves: each model of its repository with the versions its
        server holds ready (asked of the server), and the run the repository was written from."""
        from recserve.artifacts.repository_record import read_repository_info

        state = ("ready" if self.ready() else "starting or not ready") if self.alive() else "exited"
        models = served_versions(f"{self.host}:{self.http_port}", Path(self.repo)) if state == "ready" else []
        run = read_repository_info(Path(self.repo)).get("run")
        return dataclasses.asdict(self) | {"state": state, "models": models, "run": run}


def served_versions(http_url: str, repo: Path) -> list[dict]:
    """Each model of ``repo`` with the versions the server at ``http_url`` serves (its metadata; [] for one it
    does not serve)."""
    import urllib.error
    import urllib.request

    models = []
    for config in sorted(Path(repo).glob("*/config.pbtxt")):
        name = config.parent.name
        try:
            with urllib.request.urlopen(f"http://{http_url}/v2/models/{name}", timeout=2) as reply:
                versions = json.loads(reply.read()).get("versions", [])
        except (urllib.error.URLError, OSError, ValueError):
            versions = []
        models.append({"name": name, "versions": versions})
    return models


def read_records() -> list[ServerRecord]:
    """Every detached server's record, by HTTP port."""
    records = []
    for path in sorted(servers_dir().glob("*.json")):
        try:
            records.append(ServerRecord(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # a record being written, or one of another version: not ours to read
    return sorted(records, key=lambda r: r.http_port)


def start_detached(
    repo: Path, settings: ServerSettings, gpu: bool, ready_timeout_s: float, watch_secs: float
) -> ServerRecord:
    """Starts the Triton server on ``repo`` in a process of its own, and waits until every model is ready.

    Raises:
        ServingError: the process exited first (with its log's last lines), or was not ready in time.
    """
    from recserve.serving.triton_server.launcher import check_ports, check_repository

    settings.validate()
    if not Path(repo).is_dir():
        raise ServingError(f"{repo}: no such model repository; write one with `recserve repo`")
    check_repository(Path(repo))  # refused here, before a process is started for it
    held = next((r for r in read_records() if r.http_port == settings.http_port and r.alive()), None)
    if held is not None:
        raise ServingError(
            f"HTTP port {settings.http_port}: recserve already serves {held.repo} there (process {held.pid}); "
            f"`recserve stop --http-port {settings.http_port}` first, or choose another with --http-port"
        )
    check_ports(settings)
    log = new_log("serve", settings.http_port)
    spec = {
        "repo": str(Path(repo).resolve()),
        "settings": dataclasses.asdict(settings),
        "gpu": gpu,
        "ready_timeout_s": ready_timeout_s,
        "watch_secs": watch_secs,
        "log": str(log),
    }
    with os.fdopen(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", "from recserve.serving.triton_server.detached import run_detached; run_detached()"],
            env=os.environ | {SPEC_ENV: json.dumps(spec)},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's hangup or Ctrl-C does not reach it
        )
    deadline = time.monotonic() + ready_timeout_s + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise ServingError(f"the detached server exited with code {process.returncode}:\n{tail}")
        ours = next((r for r in read_records() if r.http_port == settings.http_port and r.pid == process.pid), None)
        if ours is not None:  # the record its process wrote, once its own server was ready
            return ours
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGTERM)
    raise ServingError(f"the detached server was not ready within {ready_timeout_s:.0f} s; its log: {log}")


def run_detached() -> None:
    """The detached process: serves the spec in ``SPEC_ENV`` until SIGTERM, its record written once ready."""
    from recserve.serving.triton_server.launcher import ServerSettings, TritonServer
    from recserve.serving.triton_server.supervisor import serve_until_signalled

    spec = json.loads(os.environ.pop(SPEC_ENV))
    fields = spec["settings"] | {
        "extra_args": tuple(spec["settings"]["extra_args"]),
        "extra_env": tuple(tuple(pair) for pair in spec["settings"]["extra_env"]),
    }
    settings = ServerSettings(**fields)
    say = lambda message: print(message, flush=True)  # noqa: E731 - into its log, which status names
    lock = os.open(servers_dir() / f"{settings.http_port}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held for the process's life: one server a port
    except OSError:
        say(f"error: another recserve serve holds HTTP port {settings.http_port}; nothing was started")
        sys.exit(1)
    triton_log = new_log("triton", settings.http_port)
    server = TritonServer(Path(spec["repo"]), settings, log_path=triton_log, gpu=spec["gpu"])
    path = servers_dir() / f"{settings.http_port}.json"
    path.unlink(missing_ok=True)  # a record left by a server that died: the lock says none runs

    def ready() -> None:  # the record, whole or not at all: the starting command waits for it
        record = ServerRecord(
            os.getpid(),
            spec["repo"],
            settings.host,
            settings.http_port,
            settings.grpc_port,
            settings.metrics_port,
            str(triton_log),
            spec["log"],
            datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            server.server_id,
            start_ticks(os.getpid()) or 0,
        )
        write_private(path, json.dumps(dataclasses.asdict(record), indent=2) + "\n")
        print(f"ready: {record.host} HTTP {record.http_port}, gRPC {record.grpc_port}", flush=True)

    try:
        code = serve_until_signalled(server, spec["watch_secs"], spec["ready_timeout_s"], ready, report=say)
    except ServingError as err:  # said in its log, which the starting command shows
        say(f"error: {err}")
        server.stop()
        code = 1
    finally:
        path.unlink(missing_ok=True)  # this process's own record: it holds the port's lock
    sys.exit(code)


def stop_server(record: ServerRecord, timeout_s: float = 60) -> bool:
    """SIGTERM to a detached server (it lets in-flight requests finish), SIGKILL to its group past
    ``timeout_s`` (the group it leads: its own server's); its record removed. Only the record's own process
    is ever signalled (``ServerRecord.alive``): a record whose process is gone, or whose number another process
    took since, is removed and nothing is signalled. Returns whether it had to be killed."""
    if record.alive():
        os.kill(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while record.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if record.alive() and os.getpgid(record.pid) == record.pid:
            os.killpg(record.pid, signal.SIGKILL)
            record.path.unlink(missing_ok=True)
            return True
    record.path.unlink(missing_ok=True)
    return False
