"""An event through Triton's `events` model (python) and `events_native` (recserve's backend, appends in C++)
against the same append made directly on the store, at concurrency 1: what the one endpoint costs a click beside
a client of the store's own, and where that cost goes.

A synthetic run (random weights; the events models load no graph), the session and native session layouts and
the floor over recserve's embedded store; ``--calls`` events each way, interleaved in rounds so that a noisy host
moves all alike, each with its own event ID. Five paths:

- ``events_model``, ``events_native``: `RecommenderClient.send_events` (tritonclient over gRPC);
- ``events_native_raw``: the same request as one protobuf message on gRPC's own stub (no tritonclient): the
  client's share is the difference;
- ``floor_raw``: recserve's floor (its backend answering with no work at all) the same way: Triton's own path,
  which no model through Triton can go below; ``events_native_raw - floor_raw`` is the append's own cost;
- ``store_append``: `SessionStore.append` on the store directly (redis-py);
- ``store_append_c``: the commands recserve's backend sends for an event, pipelined from C with hiredis
  (``direct_append.c``, compiled here from the hiredis sources recserve's backend builds with): the direct
  append of a compiled client, beside perf_analyzer's C++ client at concurrency 1 (``--levels 1``).

With ``--levels`` (say 1,8,32), then perf_analyzer (C++, asynchronous) at each concurrency on ``events_native``
(events without IDs: each one a new member), ``recommender_native_session`` (recommendations of stored sessions,
the model on ``--device``) and the floor: the events' throughput beside the recommend path's.

    python benchmarks/events_latency.py --out events-latency.json
    python benchmarks/events_latency.py --device gpu --items 100000 --levels 1,8,32,128 --out events-gpu.json

Figures printed and written as JSON: p50 and p99 milliseconds of each path, their ratios, and each level's
throughput and latency.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

import numpy as np
import torch
from tritonclient.utils import serialize_byte_tensor

from recserve.artifacts.served import NativeShape
from recserve.bench import perf_analyzer as pa
from recserve.bench.synthetic import make_random_run
from recserve.client import RecommenderClient
from recserve.constants import (
    FLOOR_MODEL,
    INPUT_EVENT_IDS,
    INPUT_EXCLUDE_SEEN,
    INPUT_ITEM_IDS,
    INPUT_K,
    INPUT_SESSION_ID,
    NATIVE_EVENTS_MODEL,
    NATIVE_SESSION_MODEL,
)
from recserve.export.exporter import export_run
from recserve.host import describe as describe_host
from recserve.processes import free_ports
from recserve.serving.triton_repository.layouts import write_repository
from recserve.serving.triton_repository.repository_settings import RepositorySettings
from recserve.serving.triton_server.launcher import ServerSettings, TritonServer
from recserve.sessions import embedded_store
from recserve.sessions.session_store import Event, SessionStore
from recserve.sessions.store_settings import StoreSettings

SESSIONS = 1000  # the sessions the throughput phase loads, asks for and appends to
DIRECT_APPEND_C = Path(__file__).with_name("direct_append.c")
SOURCES = ("hiredis.c", "net.c", "read.c", "sds.c", "alloc.c", "sockcompat.c", "async.c")  # as the backend links


class RawGrpc:
    """One model's request as a prebuilt protobuf message on gRPC's own stub: what a lean client in any
    language pays, without tritonclient's Python."""

    def __init__(self, url: str):
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        self.pb = service_pb2
        self.channel = grpc.insecure_channel(url)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    def call(self, model: str, tensors: list[tuple[str, str, np.ndarray | list[str]]]) -> None:
        request = self.pb.ModelInferRequest(model_name=model)
        for name, datatype, value in tensors:
            if datatype == "BYTES":  # Triton's raw BYTES, as tritonclient writes them
                words = np.array([str(v).encode() for v in value], dtype=np.object_)
                request.inputs.add(name=name, datatype=datatype, shape=[1, len(words)])
                request.raw_input_contents.append(serialize_byte_tensor(words).item())
            else:
                array = np.asarray(value).reshape(1, -1)
                request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
                request.raw_input_contents.append(array.tobytes())
        self.stub.ModelInfer(request)

    def close(self) -> None:
        self.channel.close()


def latency_paths(
    client: RecommenderClient, raw: RawGrpc, store: SessionStore, floor_width: int
) -> dict[str, Callable]:
    """Each path's call of event (or round) ``n``, every event with an ID of its own."""
    history = np.arange(1, floor_width + 1, dtype=np.int64)

    def floor(n: int) -> None:
        raw.call(
            FLOOR_MODEL,
            [
                (INPUT_ITEM_IDS, "INT64", history),
                (INPUT_K, "INT32", np.array([10], np.int32)),
                (INPUT_EXCLUDE_SEEN, "BOOL", np.array([True])),
            ],
        )

    def native_raw(n: int) -> None:
        item = np.array([1 + n % 2000], np.int64)
        raw.call(
            NATIVE_EVENTS_MODEL,
            [
                (INPUT_SESSION_ID, "BYTES", [f"r-{n % 50}"]),
                (INPUT_ITEM_IDS, "INT64", item),
                (INPUT_EVENT_IDS, "BYTES", [f"r-{n}"]),
            ],
        )

    return {
        "events_model": lambda n: client.send_events(f"s-{n % 50}", [1 + n % 2000], [f"m-{n}"]),
        "events_native": lambda n: client.send_events(
            f"n-{n % 50}", [1 + n % 2000], [f"c-{n}"], model=NATIVE_EVENTS_MODEL
        ),
        "events_native_raw": native_raw,
        "floor_raw": floor,
        "store_append": lambda n: store.append([Event(f"t-{n % 50}", 1 + n % 2000, event_id=f"d-{n}")]),
    }


def measure_latency(paths: dict[str, Callable], calls: int) -> dict[str, float]:
    """Each path ``calls`` times, one of each a round (20 rounds of warm-up first, discarded): p50 and p99 ms."""
    times: dict[str, list[float]] = {name: [] for name in paths}
    for n in range(-20, calls):
        for name, call in paths.items():
            start = time.perf_counter()
            call(n + 20_000 if n < 0 else n)  # warm-up rounds with IDs of their own
            if n >= 0:
                times[name].append((time.perf_counter() - start) * 1e3)
    figures = {}
    for name, values in times.items():
        figures[f"{name}_p50_ms"] = round(float(np.percentile(values, 50)), 3)
        figures[f"{name}_p99_ms"] = round(float(np.percentile(values, 99)), 3)
    direct = figures["store_append_p50_ms"]
    figures["p50_ratio"] = round(figures["events_model_p50_ms"] / direct, 2)
    figures["native_p50_ratio"] = round(figures["events_native_p50_ms"] / direct, 2)
    figures["native_raw_p50_ratio"] = round(figures["events_native_raw_p50_ms"] / direct, 2)
    figures["floor_raw_p50_ratio"] = round(figures["floor_raw_p50_ms"] / direct, 2)
    figures["append_own_p50_ms"] = round(figures["events_native_raw_p50_ms"] - figures["floor_raw_p50_ms"], 3)
    figures["client_share_p50_ms"] = round(figures["events_native_p50_ms"] - figures["events_native_raw_p50_ms"], 3)
    return figures


def compiled_direct_append(folder: Path) -> Path:
    """``direct_append.c`` built against hiredis's C sources (the archive recserve's backend is built from)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "native"))
    import backend_sources

    offline = os.environ.get(backend_sources.OFFLINE_ENV)  # the offline sources, where a build machine has them
    with tarfile.open(backend_sources.hiredis_archive(Path(offline) if offline else None)) as archive:
        archive.extractall(folder / "hiredis", filter="data")
    sources = next((folder / "hiredis").glob("*/vendor/hiredis"))
    binary = folder / "direct_append"
    files = [DIRECT_APPEND_C, *(sources / name for name in SOURCES)]
    subprocess.run(["cc", "-O2", "-o", binary, f"-I{sources}", *map(str, files)], check=True)
    return binary


def direct_append_c(binary: Path, settings: StoreSettings, calls: int) -> dict[str, float]:
    """``calls`` appends from C (20 first, discarded): p50 and p99 ms."""
    where = urlsplit(settings.url)
    words = [where.hostname, str(where.port), settings.username or "", settings.prefix, str(calls + 20)]
    secret = {"RECSERVE_STORE_PASSWORD": settings.secret() or ""}  # the environment: argv is any user's to read
    done = subprocess.run(
        [str(binary), *words, str(settings.window), str(settings.ttl_s)],
        capture_output=True,
        text=True,
        env=os.environ | secret,
    )
    if done.returncode != 0:
        raise RuntimeError(f"direct_append: {done.stderr.strip()}")
    values = [float(x) / 1e3 for x in done.stdout.split()[20:]]
    return {
        "store_append_c_p50_ms": round(float(np.percentile(values, 50)), 3),
        "store_append_c_p99_ms": round(float(np.percentile(values, 99)), 3),
    }


def throughput_inputs(folder: Path, store: SessionStore, native_width: int) -> dict[str, Path]:
    """perf_analyzer's input file of each model: events (sessions bench-N, an item each, no event ID: each
    stored as a new member), recommendations of those sessions, and the floor's padded histories."""
    sessions = [pa.BENCH_SESSION.format(n) for n in range(SESSIONS)]
    store.forget(sessions)
    store.append_histories(sessions, [list(range(1 + n % 50, 31 + n % 50)) for n in range(SESSIONS)], per_call=100)
    rows = {
        NATIVE_EVENTS_MODEL: [
            pa.session_input(n) | {INPUT_ITEM_IDS: {"content": [int(1 + n % 2000)], "shape": [1]}}
            for n in range(SESSIONS)
        ],
        NATIVE_SESSION_MODEL: [pa.session_input(n, every_input=True) for n in range(SESSIONS)],
        FLOOR_MODEL: [
            {
                INPUT_ITEM_IDS: {"content": list(range(1, native_width + 1)), "shape": [native_width]},
                INPUT_K: {"content": [10], "shape": [1]},
                INPUT_EXCLUDE_SEEN: {"content": [True], "shape": [1]},
            }
        ],
    }
    files = {}
    for model, data in rows.items():
        files[model] = folder / f"{model}.json"
        files[model].write_text(json.dumps({"data": data}))
    return files


def measure_throughput(url: str, files: dict[str, Path], levels: list[int], folder: Path, window_ms: int) -> list[dict]:
    """Each model at each concurrency, one perf_analyzer run each (bounded), interleaved by level."""
    rows = []
    for level in levels:
        for model, inputs in files.items():
            result = pa.run(
                model,
                url,
                "grpc",
                pa.LoadLevel("concurrency", level),
                inputs,
                window_ms,
                folder / f"{model}-{level}.csv",
                timeout_s=120,
            )
            rows.append({"model": model, "concurrency": level} | result)
            shown = {k: result[k] for k in ("throughput_rps", "p50_ms", "p99_ms", "error") if k in result}
            print(json.dumps({"model": model, "concurrency": level} | shown), flush=True)
    return rows


def compiled_clients_ratio(loads: list[dict], figures: dict[str, float]) -> dict[str, float]:
    """events_native's p50 at concurrency 1 from perf_analyzer (C++) over the direct append from C."""
    row = next(
        (r for r in loads if r["model"] == NATIVE_EVENTS_MODEL and r["concurrency"] == 1 and "p50_ms" in r), None
    )
    if row is None:
        return {}
    return {"native_compiled_p50_ratio": round(row["p50_ms"] / figures["store_append_c_p50_ms"], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=400, help="events sent each way at concurrency 1")
    parser.add_argument("--items", type=int, default=2000, help="the random run's catalogue")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="the recommend path's device")
    parser.add_argument(
        "--levels", default="", help="concurrencies of the throughput phase (perf_analyzer); empty: none"
    )
    parser.add_argument("--measurement-ms", type=int, default=2000, help="perf_analyzer's window at each level")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",") if x]
    work = Path(tempfile.mkdtemp(prefix="events-latency-"))
    run = make_random_run(work / "run", num_items=args.items, hidden=64, layers=1, heads=2, window=50)
    precision = "bf16" if args.device == "gpu" else "fp32"
    export_run(run, "torchscript", precision, work / "export", device="cuda" if args.device == "gpu" else "cpu")
    direct = compiled_direct_append(work)
    store_dir = work / "store"
    settings = embedded_store.start(store_dir)
    try:
        repository = RepositorySettings(session_store=str(store_dir), native_runtime="recserve", device=args.device)
        write_repository(work / "export", work / "repo", ("session", "native_session", "floor"), repository)
        http, grpc_port, metrics = free_ports(3)
        server = ServerSettings(http_port=http, grpc_port=grpc_port, metrics_port=metrics)
        with (
            TritonServer(work / "repo", server) as triton,
            RecommenderClient(triton.grpc_url) as client,
            SessionStore(settings, "int64") as store,
        ):
            with RecommenderClient(triton.grpc_url, model=FLOOR_MODEL) as floor:
                width = cast(NativeShape, floor.native_shape()).length
            raw = RawGrpc(triton.grpc_url)
            try:
                figures = measure_latency(latency_paths(client, raw, store, width), args.calls)
            finally:
                raw.close()
            figures |= direct_append_c(direct, settings, args.calls)
            print(json.dumps(figures), flush=True)
            loads = []
            if levels:
                files = throughput_inputs(work, store, width)
                loads = measure_throughput(triton.grpc_url, files, levels, work, args.measurement_ms)
                figures |= compiled_clients_ratio(loads, figures)
    finally:
        embedded_store.stop(store_dir)
    if args.out is not None:
        host = describe_host(torch.cuda.get_device_name(0) if args.device == "gpu" else None)
        report = {"host": host, "calls": args.calls, "items": args.items, "device": args.device} | figures
        args.out.write_text(json.dumps(report | {"throughput": loads}, indent=2) + "\n")


if __name__ == "__main__":
    main()
