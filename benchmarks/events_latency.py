"""An event through Triton's `events` model (python) and `events_native` (recserve's backend, appends in C++)
against the same append made directly on the store, at concurrency 1 (2 CPU cores): what the one endpoint costs
a click beside a client of the store's own.

A synthetic run (random weights; the events models load no graph), the session and native session layouts over
recserve's embedded store; ``--calls`` events each way, interleaved in rounds so that a noisy host moves all
alike, each with its own event ID.

    python benchmarks/events_latency.py --out events-latency.json

Figures printed and written as JSON: p50 and p99 milliseconds of each, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from recserve.bench.synthetic import make_random_run
from recserve.client import RecommenderClient
from recserve.export.exporter import export_run
from recserve.processes import free_ports
from recserve.serving.triton_repository.layouts import write_repository
from recserve.serving.triton_repository.repository_settings import RepositorySettings
from recserve.serving.triton_server.launcher import ServerSettings, TritonServer
from recserve.sessions import embedded_store
from recserve.sessions.session_store import Event, SessionStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=400, help="events sent each way")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="events-latency-"))
    run = make_random_run(work / "run", num_items=2000, hidden=32, layers=1, heads=2, window=50)
    export_run(run, "torchscript", "fp32", work / "export")
    store_dir = work / "store"
    settings = embedded_store.start(store_dir)
    try:
        on_recserve = RepositorySettings(session_store=str(store_dir), native_runtime="recserve")
        write_repository(work / "export", work / "repo", ("session", "native_session"), on_recserve)
        http, grpc, metrics = free_ports(3)
        server = ServerSettings(http_port=http, grpc_port=grpc, metrics_port=metrics)
        times: dict[str, list[float]] = {"events_model_ms": [], "events_native_ms": [], "store_append_ms": []}
        with (
            TritonServer(work / "repo", server) as triton,
            RecommenderClient(triton.grpc_url) as client,
            SessionStore(settings, "int64") as store,
        ):
            for n in range(20):  # warm-up, discarded
                client.send_events("warm", [1 + n], [f"w-{n}"])
                client.send_events("warm", [1 + n], [f"n-{n}"], model="events_native")
                store.append([Event("warm", 1 + n, event_id=f"d-{n}")])
            for n in range(args.calls):  # interleaved: one of each a round
                start = time.perf_counter()
                assert client.send_events(f"s-{n % 50}", [1 + n % 2000], [f"m-{n}"]) == 1
                times["events_model_ms"].append((time.perf_counter() - start) * 1e3)
                start = time.perf_counter()
                assert client.send_events(f"n-{n % 50}", [1 + n % 2000], [f"c-{n}"], model="events_native") == 1
                times["events_native_ms"].append((time.perf_counter() - start) * 1e3)
                start = time.perf_counter()
                assert store.append([Event(f"t-{n % 50}", 1 + n % 2000, event_id=f"s-{n}")]).accepted == 1
                times["store_append_ms"].append((time.perf_counter() - start) * 1e3)
    finally:
        embedded_store.stop(store_dir)
    figures = {}
    for name, values in times.items():
        figures[f"{name.removesuffix('_ms')}_p50_ms"] = round(float(np.percentile(values, 50)), 3)
        figures[f"{name.removesuffix('_ms')}_p99_ms"] = round(float(np.percentile(values, 99)), 3)
    figures["p50_ratio"] = round(figures["events_model_p50_ms"] / figures["store_append_p50_ms"], 2)
    figures["native_p50_ratio"] = round(figures["events_native_p50_ms"] / figures["store_append_p50_ms"], 2)
    print(json.dumps(figures))
    if args.out is not None:
        host = {"machine": platform.machine(), "processor": platform.processor(), "cores": 2}
        args.out.write_text(json.dumps({"host": host, "calls": args.calls} | figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
