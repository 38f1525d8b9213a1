"""Sessions under a mixed load of events and requests, against a real Triton and a real store (a
repository's session layout and the store its record names; both started here unless --url is given).

Two phases, each bounded in time:

1. visibility: probes send one event and then ask for their session, first alone (the floor their client
   and the server set), then while background processes keep a load of requests by session and of events
   going (each as fast as it is answered, or ``--rate`` a second); the figure is the time from the event's
   acknowledgement to the first answer that holds it (p50, p99), and whether every answer did;
2. restart: the same load while the store is killed (SIGKILL: no shutdown save) and started again
   (``--restart-after-s``); every acknowledged event is counted and then looked for in the store, and
   every request is counted as answered, refused with the typed store error, or failed otherwise.

    python benchmarks/session_load.py --repo runs/demo/repo --store runs/demo/store --out runs/session-load.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import time
from collections import Counter
from pathlib import Path

import numpy as np

from recserve.client import RecommenderClient
from recserve.client.triton import SessionStoreError
from recserve.constants import NATIVE_SESSION_MODEL, SESSION_MODEL
from recserve.errors import StoreError
from recserve.processes import free_ports
from recserve.serving.triton_server.launcher import ServerSettings, TritonServer
from recserve.sessions import embedded_store
from recserve.sessions.session_store import Event, SessionStore


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _pace(started: float, sent: int, rate: float) -> None:
    """Waits for the next send's turn at ``rate`` a second from ``started`` (0: none, a closed loop)."""
    if rate > 0:
        time.sleep(max(0.0, started + sent / rate - time.perf_counter()))


def _requests(url: str, model: str, sessions: int, n: int, rate: float, stop, results) -> None:
    """A process of requests by session until ``stop``; its outcomes counted into ``results``."""
    outcomes: Counter = Counter()
    with RecommenderClient(url, timeout_s=5) as client:
        i, started = 0, time.perf_counter()
        while not stop.is_set():
            _pace(started, i, rate)
            session = f"load-{(n * 7919 + i) % sessions}"
            try:
                client.recommend_session(session, k=10, model=model)
                outcomes["answered"] += 1
            except SessionStoreError:
                outcomes["refused: session store"] += 1
            except Exception as err:  # counted, never hidden: any other failure is a finding
                outcomes[f"failed: {type(err).__name__}"] += 1
            i += 1
    results.put((outcomes, Counter(), time.perf_counter() - started))


def _events(folder: Path, sessions: int, item: int, n: int, rate: float, stop, results) -> None:
    """A process of single events until ``stop``; each session's acknowledged events counted."""
    outcomes: Counter = Counter()
    acknowledged: Counter = Counter()  # session -> events the store acknowledged
    store = SessionStore(embedded_store.settings_of(folder))
    i, started = 0, time.perf_counter()
    while not stop.is_set():
        _pace(started, i, rate)
        session = f"load-{(n * 104729 + i) % sessions}"
        try:
            accepted = store.append([Event(session, item)]).accepted
            acknowledged[session] += accepted
            outcomes["event acknowledged"] += accepted
        except StoreError:
            outcomes["event refused: session store"] += 1
            time.sleep(0.01)
        i += 1
    store.close()
    results.put((outcomes, acknowledged, time.perf_counter() - started))


class Load:
    """Processes of requests by session and of single events (each its own interpreter, so the probes in
    this one do not wait for their GIL) until ``finish``, each at ``rate`` a second (0: as fast as it is
    answered); counts every outcome, and the rates reached."""

    def __init__(
        self, url: str, model: str, store_folder: Path, workers: int, sessions: int, item: int, rate: float = 0.0
    ):
        self.url, self.model, self.folder = url, model, store_folder
        self.workers, self.sessions, self.item, self.rate = workers, sessions, item, rate
        self.context = multiprocessing.get_context("spawn")
        self.acknowledged: Counter = Counter()  # over every phase: session -> acknowledged events

    def run(self, during) -> Counter:
        """Starts the load, calls ``during()`` under it, ends it; returns the outcomes of that phase."""
        stop, results = self.context.Event(), self.context.Queue()
        jobs = [
            (_requests, (self.url, self.model, self.sessions, n, self.rate, stop, results)) for n in range(self.workers)
        ]
        jobs += [
            (_events, (self.folder, self.sessions, self.item, n, self.rate, stop, results))
            for n in range(max(1, self.workers // 2))
        ]
        processes = [self.context.Process(target=target, args=args) for target, args in jobs]
        for p in processes:
            p.start()
        time.sleep(2.0)  # the processes' imports and connections, before the phase counts
        try:
            during()
        finally:
            stop.set()
            outcomes: Counter = Counter()
            for _ in processes:
                done, acknowledged, seconds = results.get(timeout=60)
                outcomes += done
                self.acknowledged += acknowledged
                for what in ("answered", "event acknowledged"):  # each process's rate over its whole run
                    outcomes[f"{what} per s"] += round(done[what] / seconds)
            for p in processes:
                p.join()
        return outcomes


def visibility(url: str, model: str, folder: Path, probes: int, item: int) -> dict:
    """Each probe: one event to a fresh session, then requests until an answer holds it."""
    delays, misses = [], 0
    with SessionStore(embedded_store.settings_of(folder)) as store, RecommenderClient(url, timeout_s=5) as client:
        for n in range(probes):
            session = f"probe-{time.time_ns()}-{n}"
            store.append([Event(session, item)])
            acknowledged = time.perf_counter()
            answer = client.recommend_session(session, k=10, model=model)
            delays.append((time.perf_counter() - acknowledged) * 1000)
            misses += answer.history_length != 1  # the very next answer must hold the event
    return {
        "probes": probes,
        "next_answer_held_the_event": probes - misses,
        "ms_from_ack_to_answer_p50": round(percentile(delays, 50), 3),
        "ms_from_ack_to_answer_p99": round(percentile(delays, 99), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, required=True, help="a repository with a layout by session")
    parser.add_argument(
        "--model",
        default=SESSION_MODEL,
        choices=[SESSION_MODEL, NATIVE_SESSION_MODEL],
        help="the model asked: the session layout's (python) or the native_session layout's (recserve's backend)",
    )
    parser.add_argument("--store", type=Path, required=True, help="the embedded store's folder its record names")
    parser.add_argument("--threads", type=int, default=4, help="request processes (events: half as many)")
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="requests (or events) a second from each load process; 0: each sends the next once answered",
    )
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--probes", type=int, default=300)
    parser.add_argument("--item", type=int, default=50, help="an item ID of the catalogue, for every event")
    parser.add_argument("--restart-s", type=float, default=6.0, help="the restart phase's length")
    parser.add_argument("--restart-after-s", type=float, default=2.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    embedded_store.start(args.store)
    http, grpc, metrics = free_ports(3)
    settings = ServerSettings(http_port=http, grpc_port=grpc, metrics_port=metrics, exit_timeout_secs=5)
    result: dict = {"model": args.model, "threads": args.threads, "rate": args.rate, "sessions": args.sessions}
    with SessionStore(embedded_store.settings_of(args.store)) as store:  # the load's sessions start empty
        store.forget([f"load-{n}" for n in range(args.sessions)])
    with TritonServer(args.repo, settings) as server:
        url = server.grpc_url
        # the probes alone first: the floor their own client and the server set, before any load
        result["visibility_without_load"] = visibility(url, args.model, args.store, args.probes, args.item)
        print("visibility without load:", json.dumps(result["visibility_without_load"]), flush=True)
        load = Load(url, args.model, args.store, args.threads, args.sessions, args.item, args.rate)
        probes: dict = {}
        under_load = load.run(lambda: probes.update(visibility(url, args.model, args.store, args.probes, args.item)))
        result["visibility"] = probes | {"under_load": dict(under_load)}
        print("visibility under load:", json.dumps(result["visibility"]), flush=True)
        restart: dict = {}

        def kill_and_restart() -> None:
            time.sleep(args.restart_after_s)
            started = time.perf_counter()
            os.kill(int((args.store / "server.pid").read_text()), signal.SIGKILL)  # a crash: no shutdown save
            while embedded_store.running(args.store):
                time.sleep(0.01)
            time.sleep(0.5)
            embedded_store.start(args.store)
            restart["down_s"] = time.perf_counter() - started
            time.sleep(max(0.0, args.restart_s - args.restart_after_s - restart["down_s"]))

        outcomes = load.run(kill_and_restart)
        down_s = restart["down_s"]
    with SessionStore(embedded_store.settings_of(args.store)) as store:
        sessions = sorted(load.acknowledged)
        held = store.recent(sessions, store.settings.window)
    window = embedded_store.settings_of(args.store).window
    lost = sum(
        max(0, min(load.acknowledged[s], window) - sum(1 for x in items if x == str(args.item)))
        for s, items in zip(sessions, held)
    )
    result["restart"] = {
        "store_down_s": round(down_s, 3),
        "outcomes": dict(outcomes),
        "events_acknowledged": sum(load.acknowledged.values()),
        "acknowledged_events_lost": lost,
        "note": "each session's list keeps its newest `window` items: at most that many are looked for",
    }
    print("restart:", json.dumps(result["restart"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    embedded_store.stop(args.store)


if __name__ == "__main__":
    main()
