"""Triton's own request traces (``--trace-config level=TIMESTAMPS``), read back window by window: where each
traced request spent its time in the server, stage by stage, and where the slowest hundredth spent it.

Triton's statistics give each step's mean; a tail (p99 many times p50) hides in the means. A trace has every
timestamp of one request, so the slowest requests can be taken apart. Triton stamps them with the steady
clock (CLOCK_MONOTONIC on Linux), the clock of ``time.monotonic_ns``: a window measured in this process
selects the requests that arrived in it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recserve.artifacts.served import LAYOUTS

# The stages of one request, in the order they happen, from the frontend having read it to the frontend
# having sent its answer; they add up to the whole ("server"). gRPC's and HTTP's stamps are alternatives.
RECEIVED = ("GRPC_WAITREAD_END", "HTTP_RECV_END")
SENT = ("GRPC_SEND_END", "HTTP_SEND_END")
STAGES = (  # (name, from, to): what Triton's trace calls the ends of each
    ("frontend", RECEIVED, ("QUEUE_START",)),  # read, made a request, handed to the scheduler
    ("queue", ("QUEUE_START",), ("COMPUTE_START",)),  # waiting for an instance (and the batch)
    ("input", ("COMPUTE_START",), ("COMPUTE_INPUT_END",)),  # the backend reading the batch's requests
    ("infer", ("COMPUTE_INPUT_END",), ("COMPUTE_OUTPUT_START",)),  # the backend's model run
    ("answer", ("COMPUTE_OUTPUT_START",), SENT),  # the answers made, and sent by the frontend
)
TAIL = 0.01  # the slowest hundredth


def trace_args(path: Path, rate: int) -> tuple[str, ...]:
    """The server options that trace one request in ``rate`` into ``path`` (``path``.0, .1, ... as it goes)."""
    if rate < 1:
        raise ValueError(f"trace rate {rate}: expected one request in N, N >= 1")
    return (
        f"--trace-config=triton,file={path}",
        "--trace-config=triton,log-frequency=1000",
        f"--trace-config=rate={rate}",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=count=-1",
    )


@dataclass(frozen=True)
class Trace:
    model: str
    stamps: dict[str, int]  # timestamp name -> steady-clock ns

    def first(self, names: tuple[str, ...]) -> int:
        """The stamp of the first of ``names`` it has (``read_traces`` keeps traces that have one)."""
        return next(self.stamps[n] for n in names if n in self.stamps)


def read_traces(path: Path) -> list[Trace]:
    """Every complete trace in the files Triton wrote for ``path`` (``path`` and ``path``.N): those with a
    model and every stage's stamps. Raises ValueError on a file that is not a trace file."""
    records: dict[int, dict] = {}
    files = sorted(path.parent.glob(path.name + "*"))
    for file in files:
        try:
            entries = json.loads(file.read_text() or "[]")
        except json.JSONDecodeError as err:
            raise ValueError(f"{file}: not a Triton trace file ({err})") from err
        if not isinstance(entries, list):
            raise ValueError(f"{file}: not a Triton trace file (a JSON list expected)")
        for entry in entries:
            record = records.setdefault(int(entry["id"]), {"model": None, "stamps": {}})
            if "model_name" in entry:
                record["model"] = entry["model_name"]
            for stamp in entry.get("timestamps", ()):
                record["stamps"][stamp["name"]] = int(stamp["ns"])
    needed = [names for _, start, end in STAGES for names in (start, end)]
    return [
        Trace(r["model"], r["stamps"])
        for r in records.values()
        if r["model"] is not None and all(any(n in r["stamps"] for n in names) for names in needed)
    ]


def stage_times(traces: list[Trace]) -> dict[str, np.ndarray]:
    """Milliseconds each trace spent in each stage, and in all (``server``), one array entry per trace."""
    out = {
        name: np.array([t.first(end) - t.first(start) for t in traces], dtype=np.float64) / 1e6
        for name, start, end in STAGES
    }
    out["server"] = np.array([t.first(SENT) - t.first(RECEIVED) for t in traces], dtype=np.float64) / 1e6
    return out


def window_summary(traces: list[Trace], model: str, start_ns: int, end_ns: int) -> dict:
    """The traces of ``model`` received in [start_ns, end_ns]: each stage's p50 and p99 (ms), and the mean
    of each stage over the slowest hundredth by server time (at least one trace), which says where a tail
    is spent."""
    chosen = [t for t in traces if t.model == model and start_ns <= t.first(RECEIVED) <= end_ns]
    if not chosen:
        return {"traces": 0}
    times = stage_times(chosen)
    slowest = np.argsort(times["server"])[-max(1, int(round(len(chosen) * TAIL))) :]
    return {
        "traces": len(chosen),
        "p50_ms": {name: float(np.percentile(v, 50)) for name, v in times.items()},
        "p99_ms": {name: float(np.percentile(v, 99)) for name, v in times.items()},
        "slowest": {
            "traces": len(slowest),
            "mean_ms": {name: float(v[slowest].mean()) for name, v in times.items()},
        },
    }


class TraceFiles:
    """A sweep's traces: the server options that write them (one request in ``rate``; none at 0) into a folder
    of their own, read after the server has stopped (every trace then written), and removed with it."""

    def __init__(self, rate: int):
        self.rate = rate
        self._folder = tempfile.TemporaryDirectory()
        self.file = Path(self._folder.name) / "trace.json"
        self.server_args = trace_args(self.file, rate) if rate else ()

    def __enter__(self) -> TraceFiles:
        return self

    def __exit__(self, *exc) -> None:
        self._folder.cleanup()

    def summarize(self, windows: list[tuple[dict, int, int]], keep_in: Path | None = None) -> None:
        """Gives each (row, start ns, end ns) ``trace``: its window's traced requests (``window_summary``), and
        with ``keep_in`` the window and a copy of the trace files in its traces/ folder."""
        if not self.rate:
            return
        traces = read_traces(self.file)
        for row, start, end in windows:
            row["trace"] = window_summary(traces, LAYOUTS[row["layout"]].entry, start, end)
            if keep_in is not None:
                row["trace"]["window_ns"] = [start, end]
        if keep_in is not None:
            (keep_in / "traces").mkdir(exist_ok=True)
            for file in self.file.parent.glob(self.file.name + "*"):
                shutil.copy(file, keep_in / "traces" / file.name)
