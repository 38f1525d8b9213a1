"""Bad requests among good ones under load, through a real Triton and a real store (2 CPU cores): does any
healthy request fail beside them, how fast is each bad one refused, and what do they do to the healthy p99?

A synthetic run (random weights, a category per item), exported eager, served by the fused and the session
layouts with recserve's embedded store. For each layout, ``--threads`` clients send ``--requests`` requests
each; every ``--bad-every``-th is bad, in turn: a rule whose number is past int64 (once an OverflowError that
failed the requests batched with it) and, for the session layout, a million items to append (once 18 s of the
only instance). The same load without bad requests first gives the healthy p99 to compare.

    python benchmarks/bad_request_probe.py --out bad-requests.json

Figures printed and written as JSON: healthy requests failed, the bad ones' refusal times (p50, max), healthy
p50/p99 in milliseconds with and without the bad ones.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from recserve.bench.synthetic import make_random_run
from recserve.client import RecommenderClient, RecommendError, Rules
from recserve.constants import FUSED_MODEL, SESSION_MODEL
from recserve.export.exporter import export_run
from recserve.processes import free_ports
from recserve.serving.triton_repository.layouts import write_repository
from recserve.serving.triton_repository.repository_settings import RepositorySettings
from recserve.serving.triton_server.launcher import ServerSettings, TritonServer
from recserve.sessions import embedded_store

MILLION = np.arange(1, 1_000_001, dtype=np.int64) % 2000 + 1  # the items of the bad append, made once


def _one(url: str, model: str, n: int, bad: str | None) -> tuple[bool, bool, float]:
    """(bad, failed, milliseconds of the call alone: the client connected and the items made before)."""
    history = np.array([1 + n % 50, 2 + n % 70, 3 + n % 90])
    rules = Rules(where='category == "c01"' if bad != "rule" else 'category == "c01" or year < 1' + "0" * 400)
    with RecommenderClient(url, model=model) as client:
        client.is_ready()
        start = time.perf_counter()
        try:
            if model == SESSION_MODEL:
                items = MILLION if bad == "append" else history
                client.recommend_session(f"probe-{n % 200}", items, k=10, rules=rules)
            else:
                client.recommend(history, k=10, rules=rules)
            failed = False
        except RecommendError:
            failed = True
        return bad is not None, failed, (time.perf_counter() - start) * 1e3


def _load(url: str, model: str, threads: int, requests: int, bad_every: int) -> dict:
    kinds = ["rule", "append"] if model == SESSION_MODEL else ["rule"]
    plan = [(n, kinds[(n // bad_every) % len(kinds)] if bad_every and n % bad_every == bad_every - 1 else None)
            for n in range(threads * requests)]  # fmt: skip
    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(lambda p: _one(url, model, *p), plan))
    healthy = [(failed, ms) for bad, failed, ms in results if not bad]
    refused = [ms for (bad, failed, ms), (_, kind) in zip(results, plan) if bad and failed]
    times = np.array([ms for _, ms in healthy])
    figures = {
        "healthy": len(healthy),
        "healthy_failed": sum(failed for failed, _ in healthy),
        "healthy_p50_ms": round(float(np.percentile(times, 50)), 2),
        "healthy_p99_ms": round(float(np.percentile(times, 99)), 2),
        "bad": len(plan) - len(healthy),
        "bad_refused": len(refused),
    }
    for kind in kinds:
        own = [ms for (bad, failed, ms), (_, k) in zip(results, plan) if bad and k == kind]
        if own:
            figures[f"{kind}_refused_p50_ms"] = round(float(np.percentile(own, 50)), 2)
            figures[f"{kind}_refused_max_ms"] = round(float(max(own)), 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--requests", type=int, default=40, help="requests a thread, a run")
    parser.add_argument("--bad-every", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bad-requests-"))
    run = make_random_run(work / "run", num_items=args.items, hidden=64, layers=2, heads=2, window=50)
    export_run(run, "eager", "fp32", work / "export")
    store = work / "store"
    embedded_store.start(store)
    try:
        settings = RepositorySettings(session_store=str(store), max_queue_delay_microseconds=2000)
        write_repository(work / "export", work / "repo", ("fused", "session"), settings)
        http, grpc, metrics = free_ports(3)
        server = ServerSettings(http_port=http, grpc_port=grpc, metrics_port=metrics)
        rows = []
        with TritonServer(work / "repo", server) as triton:
            for model in (FUSED_MODEL, SESSION_MODEL):
                _load(triton.grpc_url, model, args.threads, 5, 0)  # warm-up, discarded
                for bad_every in (0, args.bad_every):
                    row = {"model": model, "bad_every": bad_every}
                    row |= _load(triton.grpc_url, model, args.threads, args.requests, bad_every)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    finally:
        embedded_store.stop(store)
    if args.out is not None:
        host = {"machine": platform.machine(), "processor": platform.processor(), "cores": 2}
        args.out.write_text(json.dumps({"host": host, "threads": args.threads, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
