"""Runs the C++ perf_analyzer against a running server and reads its CSV, plus Triton's own statistics."""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recserve.artifacts.served import LAYOUTS, NativeShape
from recserve.constants import (
    DEFAULT_K,
    INPUT_EXCLUDE_SEEN,
    INPUT_ITEM_IDS,
    INPUT_K,
    INPUT_SESSION_ID,
    SEED_HISTORY_LENGTH,
)
from recserve.errors import ServingError

log = logging.getLogger(__name__)

TOOLS_DIR = Path("tools/perf_analyzer")


@dataclass(frozen=True)
class LoadLevel:
    kind: str  # "concurrency" or "request_rate"
    value: float


def find_perf_analyzer() -> Path:
    """``PERF_ANALYZER``, the project's tools folder, or PATH."""
    for candidate in (os.environ.get("PERF_ANALYZER"), TOOLS_DIR / "perf_analyzer", shutil.which("perf_analyzer")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise ServingError("perf_analyzer not found: run `scripts/install_perf_analyzer.sh` (or set PERF_ANALYZER)")


def write_input_data(
    histories: list[np.ndarray],
    layout: str,
    path: Path,
    string_ids: bool,
    limit: int = 1000,
    native: NativeShape | None = None,
    events_every: int = 0,
    extra: Callable[[int], dict] | None = None,
) -> int:
    """perf_analyzer's JSON input from real histories: the seed layout takes exactly 39 IDs per request; the
    native layout (``native``: its model's shape) padded histories with k 10 and seen items excluded, as
    ``RecommenderClient`` sends them. By session, the sessions ``load_bench_sessions`` loaded, by ID; with
    ``events_every`` N, every Nth request also carries an event (its history's last item again), which the
    model appends to the session before answering: a load of events and requests mixed. ``extra``: request
    n's further inputs (its business rules: ``rule_variants.RuleVariant.inputs``)."""
    rows = []
    served_layout = LAYOUTS[layout]
    if served_layout.by_session:
        count = min(limit, len(histories))
        every_input = served_layout.native  # native models take every input
        for n in range(count):
            rows.append(session_input(n, every_input))
            if events_every and n % events_every == 0 and len(histories[n]):
                item = histories[n][-1]
                rows[-1][INPUT_ITEM_IDS] = {"content": [str(item) if string_ids else int(item)], "shape": [1]}
            rows[-1] |= extra(n) if extra else {}
        path.write_text(json.dumps({"data": rows}))
        return count
    for history in histories:
        if served_layout.request == "seed":
            if len(history) < SEED_HISTORY_LENGTH:
                continue
            history = history[-SEED_HISTORY_LENGTH:]
        if native is not None:
            history = native.history(np.asarray(history))[0]
        values = [str(x) for x in history] if string_ids else [int(x) for x in history]
        row: dict = {served_layout.ids_input: {"content": values, "shape": [len(values)]}}
        if native is not None:  # native models take every input
            row[INPUT_K] = {"content": [DEFAULT_K], "shape": [1]}
            row[INPUT_EXCLUDE_SEEN] = {"content": [True], "shape": [1]}
        rows.append(row | (extra(len(rows)) if extra else {}))
        if len(rows) == limit:
            break
    if not rows:
        raise ServingError(f"no history fits the {layout} layout (it needs at least {SEED_HISTORY_LENGTH} items)")
    path.write_text(json.dumps({"data": rows}))
    return len(rows)


BENCH_SESSION = "bench-{}"  # the session IDs a session sweep loads and asks for


def session_input(n: int, every_input: bool = False) -> dict:
    """Session ``n``'s row: its ID, and with ``every_input`` k 10 and seen items excluded."""
    row: dict = {INPUT_SESSION_ID: {"content": [BENCH_SESSION.format(n)], "shape": [1]}}
    if every_input:
        row[INPUT_K] = {"content": [DEFAULT_K], "shape": [1]}
        row[INPUT_EXCLUDE_SEEN] = {"content": [True], "shape": [1]}
    return row


def load_bench_sessions(store_record: dict, histories: list[np.ndarray], limit: int = 1000) -> int:
    """Puts the first ``limit`` histories into the session store as sessions bench-0, bench-1, ... (each
    replaced whole), what a session layout's requests then ask for; returns how many."""
    from recserve.sessions.session_store import SessionStore
    from recserve.sessions.store_settings import StoreSettings

    count = min(limit, len(histories))
    with SessionStore(StoreSettings.from_record(store_record)) as store:
        sessions = [BENCH_SESSION.format(n) for n in range(count)]
        store.forget(sessions)
        store.append_histories(sessions, [np.asarray(h).tolist() for h in histories[:count]], per_call=100)
    return count


def default_client_threads() -> int:
    """One perf_analyzer thread per core this process may use, at most perf_analyzer's own default of 16.

    The load generator shares the host with the server: threads beyond the cores only add context switches
    (on 2 cores, 16 threads cost the client 85 us of CPU a request against 57 us with 2, in async mode).
    """
    return max(1, min(16, len(os.sched_getaffinity(0))))


def run(
    model: str,
    url: str,
    protocol: str,
    level: LoadLevel,
    input_file: Path,
    measurement_ms: int,
    csv_path: Path,
    timeout_s: float,
    client_threads: int | None = None,
    client_cpus: tuple[int, ...] = (),
) -> dict:
    """One bounded perf_analyzer run; returns throughput, latency percentiles (ms) and client-side parts, or
    ``errors`` and ``error`` where it failed (``timed_out`` too where it ran past ``timeout_s`` and was killed).

    Args:
        client_threads: perf_analyzer's ``--max-threads``, the threads that keep the load's requests in
            flight (asynchronously); ``default_client_threads()`` when None.
        client_cpus: the cores perf_analyzer runs on (as taskset pins it); () leaves it where it is.
    """
    binary = find_perf_analyzer()
    threads = client_threads or default_client_threads()
    load = (
        ["--concurrency-range", f"{int(level.value)}:{int(level.value)}"]
        if level.kind == "concurrency"
        else ["--request-rate-range", f"{level.value}:{level.value}"]
    )
    args = [
        str(binary),
        "-m",
        model,
        "-u",
        url,
        "-i",
        protocol,
        "--async",
        "--input-data",
        str(input_file),
        "--measurement-interval",
        str(measurement_ms),
        "--max-trials",
        "6",
        "--stability-percentage",
        "999",
        "--max-threads",
        str(threads),
        "-f",
        str(csv_path),
        *load,
    ]
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join([str(binary.parent), os.environ.get("LD_LIBRARY_PATH", "")]))
    try:
        done = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            preexec_fn=(lambda: os.sched_setaffinity(0, client_cpus)) if client_cpus else None,
        )
    except subprocess.TimeoutExpired:  # killed: a row that says so, the rows before it kept by the caller
        return {"errors": 1, "error": f"perf_analyzer ran past {timeout_s:.0f} s on {model}", "timed_out": True}
    if done.returncode != 0 or not csv_path.exists():
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        return {"errors": 1, "error": " | ".join(tail)}
    with csv_path.open() as fh:
        row = next(csv.DictReader(fh))
    us = lambda key: float(row.get(key) or 0) / 1000  # noqa: E731 - microseconds to milliseconds
    return {
        "throughput_rps": float(row["Inferences/Second"]),
        "p50_ms": us("p50 latency"),
        "p90_ms": us("p90 latency"),
        "p95_ms": us("p95 latency"),
        "p99_ms": us("p99 latency"),
        "client_send_ms": us("Client Send"),
        "network_ms": us("Network+Server Send/Recv"),
        "client_recv_ms": us("Client Recv"),
        "errors": 0,
    }


def model_statistics(http_url: str) -> dict[str, dict]:
    """Triton's cumulative per-model statistics: request count and queue/compute times (ns)."""
    with urllib.request.urlopen(f"http://{http_url}/v2/models/stats", timeout=10) as reply:
        stats = json.load(reply)["model_stats"]
    out = {}
    for model in stats:
        s = model["inference_stats"]
        out[model["name"]] = {
            "count": int(s["success"]["count"]),
            "failures": int(s["fail"]["count"]),
            **{part: int(s[part]["ns"]) for part in ("queue", "compute_input", "compute_infer", "compute_output")},
            "executions": int(model.get("execution_count", 0)),
        }
    return out


def step_breakdown(before: dict, after: dict, models: list[str]) -> dict[str, dict]:
    """Average milliseconds per request in each server step between two statistics snapshots."""
    out = {}
    for name in models:
        a, b = before.get(name), after.get(name)
        if a is None or b is None:
            continue
        count = b["count"] - a["count"]
        executions = b["executions"] - a["executions"]
        out[name] = {
            f"{part}_ms": (b[part] - a[part]) / max(count, 1) / 1e6
            for part in ("queue", "compute_input", "compute_infer", "compute_output")
        }
        out[name] |= {
            "requests": count,
            "failures": b["failures"] - a["failures"],
            "avg_batch": count / executions if executions else None,
        }
    return out


def metrics_text(metrics_url: str) -> str:
    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10) as reply:
        return reply.read().decode()


def failures_from_metrics(text: str, model: str) -> int:
    """``nv_inference_request_failure`` for a model, from the Prometheus endpoint."""
    total = 0
    for line in text.splitlines():
        if line.startswith("nv_inference_request_failure{") and f'model="{model}"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total
