"""recserve's embedded store with high availability, for the tests and a laptop's rehearsal of a failover: a
primary, one replica and one Sentinel (Valkey's own), each in a folder of its own under one folder, on
loopback. The Sentinel promotes the replica when the primary stops answering; recserve's clients ask the
Sentinel for the primary (``StoreSettings.sentinels``), so they follow.

Both nodes hold the same passwords (the application's and the operator's) and sync as the operator's user,
so either can be primary. The Sentinel listens on loopback only and takes no password: it names addresses,
never data. One Sentinel is enough to rehearse a failover; production runs three or more on separate
machines (docs/sessions.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from recserve.errors import StoreError
from recserve.processes import free_ports
from recserve.sessions import embedded_store
from recserve.sessions.store_contract import SENTINEL_SERVICE
from recserve.sessions.store_settings import StoreSettings, read_password

NODES = ("node-0", "node-1")  # the first starts as the primary
SENTINEL = "sentinel"
DOWN_AFTER_MS = 1000  # a primary that has not answered this long is down
FAILOVER_TIMEOUT_MS = 4000


def start(folder: Path, prefix: str = "recserve:", acknowledge: str = "primary") -> StoreSettings:
    """Starts (or finds running) the two nodes and the Sentinel of ``folder``; returns how to reach the
    store through the Sentinel. ``acknowledge``: "replica" to have each append wait for the replica's copy.

    Raises:
        StoreError: a node or the Sentinel did not come up (what did is stopped).
    """
    folder = embedded_store.own_folder(folder)
    with embedded_store.locked(folder):
        named = _named_primary_port(folder)  # after a failover, the node the running Sentinel names primary
        first = folder / NODES[0]
        follows = named if named is not None and named != _node_port(first) else None
        primary = embedded_store.start(first, prefix, replica_of=follows)
        replica = folder / NODES[1]
        embedded_store.own_folder(replica)
        for name in (embedded_store.PASSWORD_FILE, embedded_store.ADMIN_PASSWORD_FILE):
            if not (replica / name).exists():
                shutil.copy2(first / name, replica / name)
        primary_port = named if named is not None else _port(primary)
        try:
            second_follows = primary_port if primary_port != _node_port(replica) else None
            embedded_store.start(replica, prefix, replica_of=second_follows)
            sentinel_port = _start_sentinel(folder / SENTINEL, primary_port)
            _wait_until(lambda: any(_synced(folder / node) for node in NODES), f"no node of {folder} synced")
            _wait_until(
                lambda: _asked(sentinel_port) is not None, f"the Sentinel in {folder / SENTINEL} did not answer"
            )
        except StoreError:
            stop(folder)
            raise
        record = primary.describe() | {"sentinels": [f"127.0.0.1:{sentinel_port}"], "service": SENTINEL_SERVICE}
        record |= {"acknowledge": acknowledge}
        embedded_store.write_private(folder / embedded_store.RECORD_FILE, json.dumps(record, indent=2))
        return StoreSettings.from_record(record)


def _wait_until(ready, what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise StoreError(f"{what} within {timeout_s} s")
        time.sleep(0.05)


def _admin(node: Path) -> redis.Redis:
    settings = embedded_store.admin_settings(node)
    return redis.Redis.from_url(settings.url, username=settings.username, password=settings.secret(), socket_timeout=2)


def _synced(node: Path) -> bool:
    """Whether ``node`` is a replica in sync with its primary (either node may be, after a failover)."""
    try:
        return _admin(node).info("replication").get("master_link_status") == "up"
    except redis.RedisError:
        return False


def _asked(sentinel_port: int, host: str = "127.0.0.1") -> int | None:
    """The primary's port as the Sentinel at ``host:sentinel_port`` names it; None where it names none or
    does not answer."""
    try:
        named: Any = redis.Redis(host=host, port=sentinel_port, socket_timeout=2).sentinel_get_master_addr_by_name(
            SENTINEL_SERVICE
        )
    except redis.RedisError:
        return None
    return int(named[1]) if named else None


def _node_port(node: Path) -> int | None:
    """The port a node's record names (None before its first start)."""
    record = Path(node) / embedded_store.RECORD_FILE
    return json.loads(record.read_text()).get("port") if record.is_file() else None


def _named_primary_port(folder: Path) -> int | None:
    """The primary's port as the folder's Sentinel names it, where one runs and answers; else None."""
    sentinel = Path(folder) / SENTINEL
    port = _node_port(sentinel)
    return _asked(port) if port is not None and embedded_store.running(sentinel) else None


def _port(settings: StoreSettings) -> int:
    return int(settings.url.rsplit(":", 1)[1].split("/")[0])


def _start_sentinel(folder: Path, primary_port: int) -> int:
    """Valkey's Sentinel watching the primary on ``primary_port``, as the operator; returns its port."""
    folder = embedded_store.own_folder(folder)
    known = _node_port(folder)
    if known is not None and embedded_store.running(folder):
        return known
    record = folder / embedded_store.RECORD_FILE
    port = known or free_ports(1)[0]
    admin_password = read_password(folder.parent / NODES[0] / embedded_store.ADMIN_PASSWORD_FILE)
    config = [
        "bind 127.0.0.1",
        f"port {port}",
        "daemonize yes",
        f"pidfile {folder / embedded_store.PID_FILE}",
        f"logfile {folder / 'server.log'}",
        f"dir {folder}",
        f"sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {primary_port} 1",
        f"sentinel auth-user {SENTINEL_SERVICE} {embedded_store.ADMIN}",
        f"sentinel auth-pass {SENTINEL_SERVICE} {admin_password}",
        f"sentinel down-after-milliseconds {SENTINEL_SERVICE} {DOWN_AFTER_MS}",
        f"sentinel failover-timeout {SENTINEL_SERVICE} {FAILOVER_TIMEOUT_MS}",
        f"sentinel parallel-syncs {SENTINEL_SERVICE} 1",
    ]
    conf = folder / "sentinel.conf"
    if not conf.exists():  # the Sentinel rewrites its file as it learns; a restart keeps what it learnt
        embedded_store.write_private(conf, "\n".join(config) + "\n")
    embedded_store.write_private(record, json.dumps({"port": port}))  # made anew, its owner's alone
    done = subprocess.run(
        [embedded_store.server_binary(), str(conf), "--sentinel"], capture_output=True, text=True, umask=0o077
    )
    if done.returncode != 0:
        raise StoreError(f"the store's Sentinel did not start: {done.stderr.strip() or done.stdout.strip()}")
    return port


def primary_folder(folder: Path) -> Path:
    """The node folder whose server the Sentinel names primary now."""
    host, port = embedded_store.settings_of(folder).sentinel_addresses()[0]
    primary_port = _asked(port, host)
    if primary_port is None:
        raise StoreError(f"{folder}: the Sentinel names no primary of {SENTINEL_SERVICE}")
    for node in NODES:
        if _node_port(Path(folder) / node) == primary_port:
            return Path(folder) / node
    raise StoreError(f"{folder}: the Sentinel names a primary on port {primary_port}, which is no node of it")


def stop(folder: Path) -> bool:
    """Stops the Sentinel and both nodes (their data stay); returns whether any was running."""
    stopped = [embedded_store.stop(Path(folder) / name) for name in (SENTINEL, *NODES)]
    return any(stopped)
