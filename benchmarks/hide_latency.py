"""A hide under load: from the store's acknowledgement of `recserve items hide` to the answers that honour it,
against a real Triton and a real store (a repository with a store in its record, served here).

Background processes keep a load of requests going (each as fast as it is answered, or ``--rate`` a second)
on the model asked. Each probe asks for a history's top 10, hides its first item through the store, and from
the acknowledgement on asks again until an answer leaves it out; every answer that started after the
acknowledgement is checked. The figures: the time from the acknowledgement to the end of the first answer
that honours the hide (p50, p99), and how many answers that started after it still held the item (must be 0).
The item is shown again before the next probe. ``--hidden-beside N`` keeps N more items hidden throughout,
which a model that read the whole set at every change would read again at each.

    python benchmarks/hide_latency.py --repo runs/demo/repo --store runs/demo/store --model recommender_native \
        --out runs/hide-latency.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from collections import Counter
from pathlib import Path

import numpy as np

from recserve.client import RecommenderClient
from recserve.constants import FUSED_MODEL
from recserve.processes import free_ports
from recserve.serving.triton_server.launcher import ServerSettings, TritonServer
from recserve.sessions import embedded_store
from recserve.sessions.session_store import SessionStore


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _load(url: str, model: str, n: int, rate: float, stop, results) -> None:
    """A process of requests for random short histories until ``stop``; its outcomes counted into ``results``."""
    outcomes: Counter = Counter()
    rng = np.random.default_rng(n)
    started = time.perf_counter()
    with RecommenderClient(url, model=model, timeout_s=5) as client:
        sent = 0
        while not stop.is_set():
            if rate > 0:
                time.sleep(max(0.0, started + sent / rate - time.perf_counter()))
            sent += 1
            try:
                client.recommend(rng.integers(1, 1000, 5), k=10)
                outcomes["answered"] += 1
            except Exception as err:  # counted by kind: the load's outcomes are a finding
                outcomes[type(err).__name__] += 1
    results.put((outcomes, time.perf_counter() - started))


def probe(client: RecommenderClient, store: SessionStore, history: np.ndarray, deadline_s: float) -> dict:
    """One hide of ``history``'s top item under the load: the delay to the first answer without it, and the
    answers that started after the acknowledgement and still held it."""
    top = int(client.recommend(history, k=10).item_ids[0])
    store.hide([str(top)])
    acknowledged = time.perf_counter()
    held, answers = 0, 0
    try:
        while True:
            answer = client.recommend(history, k=10).item_ids
            answers += 1
            if top not in answer.tolist():
                return {"ms": (time.perf_counter() - acknowledged) * 1000, "held": held, "answers": answers}
            held += 1  # started after the acknowledgement, and still held the hidden item
            if time.perf_counter() - acknowledged > deadline_s:
                return {"ms": float("inf"), "held": held, "answers": answers}
    finally:
        store.hide([str(top)], hidden=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, required=True, help="a repository whose record names a store")
    parser.add_argument("--store", type=Path, required=True, help="the embedded store's folder its record names")
    parser.add_argument("--model", default=FUSED_MODEL, help="the model asked (recommender, recommender_native)")
    parser.add_argument("--threads", type=int, default=4, help="load processes")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="requests a second from each load process (0: closed loop)"
    )
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--deadline-s", type=float, default=5.0, help="a probe gives up after this long")
    parser.add_argument(
        "--hidden-beside",
        type=int,
        default=0,
        help="items hidden throughout, beside each probe's (IDs no catalogue holds: what a served model reads, "
        "not what it answers), as a shop with many items out of stock has them",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    embedded_store.start(args.store)
    http, grpc, metrics = free_ports(3)
    settings = ServerSettings(http_port=http, grpc_port=grpc, metrics_port=metrics, exit_timeout_secs=5)
    context = multiprocessing.get_context("spawn")
    histories = [np.random.default_rng(1000 + n).integers(1, 1000, 8) for n in range(args.probes)]
    result: dict = {"model": args.model, "threads": args.threads, "rate": args.rate, "probes": args.probes}
    result["hidden_beside"] = args.hidden_beside
    ids = [str(10**12 + n) for n in range(args.hidden_beside)]
    beside = [ids[start : start + 10_000] for start in range(0, len(ids), 10_000)]  # as a shop's file is sent
    operator = embedded_store.role_settings(args.store, "operator")  # the only user that may hide
    with TritonServer(args.repo, settings) as server, SessionStore(operator) as store:
        for change in beside:
            store.hide(change)
        stop, results = context.Event(), context.Queue()
        processes = [
            context.Process(target=_load, args=(server.grpc_url, args.model, n, args.rate, stop, results))
            for n in range(args.threads)
        ]
        for p in processes:
            p.start()
        time.sleep(2.0)  # the processes' imports and connections
        try:
            with RecommenderClient(server.grpc_url, model=args.model, timeout_s=5) as client:
                probes = [probe(client, store, history, args.deadline_s) for history in histories]
        finally:
            stop.set()
            outcomes: Counter = Counter()
            for _ in processes:
                done, seconds = results.get(timeout=60)
                outcomes += done
                outcomes["answered per s"] += round(done["answered"] / seconds)
            for p in processes:
                p.join()
            for change in beside:
                store.hide(change, hidden=False)
    delays = [p["ms"] for p in probes]
    result |= {
        "ms_from_ack_to_honoured_p50": round(percentile(delays, 50), 3),
        "ms_from_ack_to_honoured_p99": round(percentile(delays, 99), 3),
        "answers_after_ack_that_held_the_item": sum(p["held"] for p in probes),
        "answers_after_ack": sum(p["answers"] for p in probes),
        "load": dict(outcomes),
    }
    print(json.dumps(result, indent=1), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
