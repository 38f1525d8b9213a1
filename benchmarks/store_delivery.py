"""The session store's delivery guarantee and memory bound, counted at scale against the real embedded Valkey
server on loopback (each phase bounded in count and time):

1. proxy: senders append events with their IDs through a TCP proxy that holds a share of the store's replies
   0.4 s (past the 0.25 s timeout), each sender sending an event again until it is acknowledged, as a shop's
   sender does; then every acknowledged event is looked for, and every member counted once;
2. kill: 8 writers as fast as acknowledged while the server is killed (SIGKILL) and started again;
3. flood: new session IDs by the million into a server bounded as ``recserve deploy k8s`` bounds it
   (maxmemory at 75% of the container's memory, volatile-lru): its memory, its evictions, and whether every
   append was acknowledged and the newest sessions read back;
4. acknowledge: on a replicated store (a primary, a replica, a Sentinel), one append at a time, its latency
   acknowledged by the primary and then by the replica too (WAIT): what the waiting acknowledgement costs.

    python benchmarks/store_delivery.py --out benchmarks/results/cpu-2core-sessions/store-delivery.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' delaying proxy

from tests.sessions.delaying_proxy import DelayingProxy

from recserve.deploy.k8s.store_objects import MAXMEMORY_SHARE, memory_bytes
from recserve.errors import StoreError
from recserve.processes import free_ports
from recserve.sessions import embedded_store, store_contract
from recserve.sessions.session_store import Event, SessionStore
from recserve.sessions.store_settings import StoreSettings


def send_until_acknowledged(store: SessionStore, event: Event, tries: int = 200) -> int:
    """The same event (its ID kept) again until acknowledged; the sends it took (0: never)."""
    for attempt in range(1, tries + 1):
        try:
            if store.append([event]).accepted == 1:
                return attempt
        except StoreError:
            time.sleep(0.01)
    return 0


def count(folder: Path, sessions: list[str], acknowledged: list[str]) -> dict:
    """Lost (acknowledged, not stored) and doubled (an event ID stored twice) events, by the operator's read."""
    admin_settings = embedded_store.admin_settings(folder)
    admin = redis.Redis.from_url(
        admin_settings.url, username=admin_settings.username, password=admin_settings.secret(), decode_responses=True
    )
    settings = embedded_store.settings_of(folder)
    members = [m for s in sessions for m in admin.zrange(settings.key(s), 0, -1)]
    ids = [m.split(store_contract.MEMBER_SEPARATOR)[0] for m in members]
    return {
        "acknowledged": len(acknowledged),
        "stored": len(members),
        "lost": len(set(acknowledged) - set(members)),
        "doubled": len(ids) - len(set(ids)),
    }


def writers(settings: StoreSettings, n_writers: int, per_writer: int, stop: threading.Event) -> tuple[list, list]:
    """Starts ``n_writers`` threads, each appending its own events; returns (threads, acknowledged members)."""
    acknowledged: list[str] = []

    def write(w: int) -> None:
        with SessionStore(settings) as store:
            for n in range(per_writer):
                if stop.is_set():
                    return
                event = Event(f"w{w}", n + 1, event_id=f"w{w}-{n}")
                if send_until_acknowledged(store, event):
                    acknowledged.append(store_contract.member(event.event_id, event.item))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(n_writers)]
    for t in threads:
        t.start()
    return threads, acknowledged


def proxy_phase(folder: Path, n: int, share: float, n_writers: int) -> dict:
    settings = embedded_store.settings_of(folder)
    port = int(settings.url.rsplit(":", 1)[1].split("/")[0])
    with DelayingProxy(("127.0.0.1", port), delay_s=0.4, share=share, seed=7) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0"
        slow = StoreSettings.from_record(settings.describe() | {"url": url, "timeout_s": 0.25, "window": 1_000_000})
        started = time.monotonic()
        threads, acknowledged = writers(slow, n_writers, n // n_writers, threading.Event())
        for t in threads:
            t.join()
        delayed, seconds = proxy.delayed, time.monotonic() - started
    return count(folder, [f"w{w}" for w in range(n_writers)], acknowledged) | {
        "replies_delayed_0_4_s": delayed,
        "share_delayed": share,
        "timeout_s": 0.25,
        "writers": n_writers,
        "seconds": round(seconds, 1),
    }


def kill_phase(folder: Path, n: int, n_writers: int, kill_after_s: float) -> dict:
    settings = StoreSettings.from_record(embedded_store.settings_of(folder).describe() | {"window": 1_000_000})
    stop = threading.Event()
    started = time.monotonic()
    threads, acknowledged = writers(settings, n_writers, n // n_writers, stop)
    time.sleep(kill_after_s)
    before = len(acknowledged)
    os.kill(int((folder / embedded_store.PID_FILE).read_text()), signal.SIGKILL)
    while embedded_store.running(folder):
        time.sleep(0.01)
    embedded_store.start(folder)
    for t in threads:
        t.join(timeout=600)
    stop.set()
    sessions = [f"w{w}" for w in range(n_writers)]
    return count(folder, sessions, acknowledged) | {
        "writers": n_writers,
        "acknowledged_before_kill": before,
        "seconds": round(time.monotonic() - started, 1),
    }


def flood_phase(folder: Path, sessions: int, memory: str, per_call: int = 10_000) -> dict:
    """A server with the StatefulSet's bound (MAXMEMORY_SHARE of ``memory``, volatile-lru) and its ACL."""
    limit = int(memory_bytes(memory) * MAXMEMORY_SHARE)
    password, operator = "flood-" + os.urandom(8).hex(), "op-" + os.urandom(8).hex()
    folder.mkdir(mode=0o700)
    digest = hashlib.sha256(password.encode()).hexdigest()
    acl = store_contract.acl_rules("recserve", digest, "flood:") + f"user operator on >{operator} ~* &* +@all\n"
    (folder / "users.acl").write_text(acl)
    port = free_ports(1)[0]
    args = ["--bind", "127.0.0.1", "--port", str(port), "--dir", str(folder), "--aclfile", str(folder / "users.acl")]
    args += ["--appendonly", "yes", "--appendfsync", "always", "--save", "", "--maxmemory", str(limit)]
    args += ["--maxmemory-policy", "volatile-lru"]
    server = subprocess.Popen([embedded_store.server_binary(), *args], stdout=subprocess.DEVNULL)
    try:
        settings = StoreSettings(
            url=f"redis://127.0.0.1:{port}/0", username="recserve", password=password, prefix="flood:", timeout_s=10
        )
        info = redis.Redis(port=port, username="operator", password=operator)
        with SessionStore(settings) as store:
            for _ in range(200):
                try:
                    store.ping()
                    break
                except StoreError:
                    time.sleep(0.05)
            acknowledged, peak, started = 0, 0, time.monotonic()
            for first in range(0, sessions, per_call):
                events = [Event(f"new-{n}", n % 5000 + 1) for n in range(first, min(first + per_call, sessions))]
                acknowledged += store.append(events).accepted
                peak = max(peak, info.info("memory")["used_memory"])
            seconds = time.monotonic() - started
            newest = store.recent([f"new-{sessions - 1}"])[0]
        stats = info.info()
    finally:
        server.terminate()
        server.wait(30)
    return {
        "sessions": sessions,
        "container_memory": memory,
        "maxmemory_bytes": limit,
        "peak_used_memory_bytes": peak,
        "peak_over_maxmemory": round(peak / limit, 3),
        "evicted_keys": stats["evicted_keys"],
        "keys_left": stats.get("db0", {}).get("keys", 0),
        "acknowledged": acknowledged,
        "newest_session_read": newest == [str((sessions - 1) % 5000 + 1)],
        "events_per_s": round(acknowledged / seconds),
    }


def acknowledge_phase(folder: Path, appends: int) -> dict:
    """One event an append, one append at a time, on a replicated store (a primary, a replica, a Sentinel):
    each append's latency with the primary's acknowledgement, then with the replica's (WAIT 1)."""
    from recserve.sessions import replicated_store

    replicated_store.start(folder)
    try:
        result = {}
        for acknowledge in ("primary", "replica"):
            settings = StoreSettings.from_record(
                embedded_store.settings_of(folder).describe() | {"acknowledge": acknowledge}
            )
            latencies = []
            with SessionStore(settings) as store:
                for n in range(appends):
                    started = time.perf_counter()
                    store.append([Event(f"ack-{n % 100}", n % 1000 + 1, event_id=f"{acknowledge}-{n}")])
                    latencies.append((time.perf_counter() - started) * 1000)
            latencies.sort()
            result[acknowledge] = {
                "appends": appends,
                "p50_ms": round(latencies[len(latencies) // 2], 3),
                "p99_ms": round(latencies[int(len(latencies) * 0.99)], 3),
            }
        result["replica_over_primary_p50"] = round(result["replica"]["p50_ms"] / result["primary"]["p50_ms"], 2)
        return result
    finally:
        replicated_store.stop(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--proxy-events", type=int, default=10_000)
    parser.add_argument("--proxy-share", type=float, default=0.05, help="share of replies held 0.4 s")
    parser.add_argument("--kill-events", type=int, default=16_000)
    parser.add_argument("--flood-sessions", type=int, default=1_000_000)
    parser.add_argument("--flood-memory", default="64Mi", help="the container's memory (Kubernetes quantity)")
    parser.add_argument("--acknowledge-appends", type=int, default=3000)
    parser.add_argument("--phases", default="proxy,kill,flood,acknowledge")
    args = parser.parse_args()
    result: dict = {"date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count()}
    phases = args.phases.split(",")
    if args.out.exists():  # a run of some phases keeps the others' figures
        result = json.loads(args.out.read_text()) | result
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "store"
        embedded_store.start(folder)
        try:
            if "proxy" in phases:
                result["proxy"] = proxy_phase(folder, args.proxy_events, args.proxy_share, 8)
                print("proxy", result["proxy"], flush=True)
            if "kill" in phases:
                result["kill"] = kill_phase(folder, args.kill_events, 8, kill_after_s=2.0)
                print("kill", result["kill"], flush=True)
        finally:
            embedded_store.stop(folder)
        if "flood" in phases:
            result["flood"] = flood_phase(Path(tmp) / "flood", args.flood_sessions, args.flood_memory)
            print("flood", result["flood"], flush=True)
        if "acknowledge" in phases:
            result["acknowledge"] = acknowledge_phase(Path(tmp) / "replicated", args.acknowledge_appends)
            print("acknowledge", result["acknowledge"], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
