"""Servers started with ``recserve serve --detach``, and the logs of every ``recserve serve``.

A detached server is a process of its own (``run_detached``: the Triton server on a repository, watched as
the foreground ``recserve serve`` watches it) that writes its record once every model is ready: recserve's
cache folder, ``servers/<http_port>.json`` (its process, repository, addresses and logs). ``recserve status``
lists the records, ``recserve stop`` stops their servers (SIGTERM: in-flight requests finish) and removes
them. Each start writes its logs under ``servers/logs/`` with the port and the time in their names, and the
last ``LOGS_KEPT`` of each kind are kept.
"""

from __future__ import annotations

import dataclasses
import datetime
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
from recserve.files import cache_dir

if TYPE_CHECKING:
    from recserve.serving.triton_server.launcher import ServerSettings

LOGS_KEPT = 20  # the logs of each kind kept (the newest)
SPEC_ENV = "RECSERVE_DETACHED_SPEC"  # what the detached process serves (JSON; in the environment, not argv)


def servers_dir() -> Path:
    folder = cache_dir() / "servers"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def new_log(kind: str, http_port: int) -> Path:
    """A fresh log file's path for a server on ``http_port`` (``kind``: triton, or serve for a detached
    process's own output), the older ones of that kind past ``LOGS_KEPT`` removed."""
    logs = servers_dir() / "logs"
    logs.mkdir(exist_ok=True)
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

    @property
    def path(self) -> Path:
        return servers_dir() / f"{self.http_port}.json"

    def alive(self) -> bool:
        """Whether its process runs (and is still a recserve process, not another that took its number)."""
        try:
            os.kill(self.pid, 0)
            command = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except (ProcessLookupError, PermissionError, FileNotFoundError):
            return False
        return b"recserve" in command

    def ready(self) -> bool:
        from recserve.serving.triton_server.launcher import answers_ready

        return answers_ready(f"{self.host}:{self.http_port}")

    def status(self) -> dict:
        state = ("ready" if self.ready() else "starting or not ready") if self.alive() else "exited"
        return dataclasses.asdict(self) | {"state": state}


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
    check_ports(settings)
    record = servers_dir() / f"{settings.http_port}.json"
    record.unlink(missing_ok=True)
    log = new_log("serve", settings.http_port)
    spec = {
        "repo": str(Path(repo).resolve()),
        "settings": dataclasses.asdict(settings),
        "gpu": gpu,
        "ready_timeout_s": ready_timeout_s,
        "watch_secs": watch_secs,
        "log": str(log),
    }
    with open(log, "wb") as out:
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
        if record.is_file():
            return ServerRecord(**json.loads(record.read_text()))
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
    triton_log = new_log("triton", settings.http_port)
    server = TritonServer(Path(spec["repo"]), settings, log_path=triton_log, gpu=spec["gpu"])
    path = servers_dir() / f"{settings.http_port}.json"

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
        )
        staging = path.with_suffix(".tmp")
        staging.write_text(json.dumps(dataclasses.asdict(record), indent=2) + "\n")
        staging.replace(path)
        print(f"ready: {record.host} HTTP {record.http_port}, gRPC {record.grpc_port}", flush=True)

    say = lambda message: print(message, flush=True)  # noqa: E731 - into its log, which status names
    try:
        code = serve_until_signalled(server, spec["watch_secs"], spec["ready_timeout_s"], ready, report=say)
    except ServingError as err:  # said in its log, which the starting command shows
        say(f"error: {err}")
        server.stop()
        code = 1
    finally:
        path.unlink(missing_ok=True)
    sys.exit(code)


def stop_server(record: ServerRecord, timeout_s: float = 60) -> bool:
    """SIGTERM to a detached server (it lets in-flight requests finish), SIGKILL to its group past
    ``timeout_s``; its record removed. Returns whether it had to be killed."""
    if record.alive():
        os.kill(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while record.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if record.alive():
            os.killpg(record.pid, signal.SIGKILL)
            record.path.unlink(missing_ok=True)
            return True
    record.path.unlink(missing_ok=True)
    return False
