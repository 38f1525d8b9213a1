"""``recserve bench``: perf_analyzer over layouts and load levels against a real server, with checks and stats."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from recserve.artifacts.repository_record import read_repository_info, store_of
from recserve.artifacts.served import LAYOUTS
from recserve.bench import perf_analyzer as pa
from recserve.bench.cpu import CpuMeter
from recserve.bench.perf_analyzer import LoadLevel
from recserve.bench.triton_trace import read_traces, trace_args, window_summary
from recserve.constants import SEED_HISTORY_LENGTH
from recserve.errors import ServingError

TOP = 10  # what check_answers and compare_native ask for

log = logging.getLogger(__name__)

STEPS = {name: list(layout.models) for name, layout in LAYOUTS.items()}  # whose statistics a row reads


def real_histories(data_dir: Path) -> tuple[list[np.ndarray], bool]:
    """Every user's test-time history as item IDs (the real length and ID distribution)."""
    from recserve.data.datasets import load_prepared

    data = load_prepared(data_dir)
    inputs = data.sequences.truncated(1)
    ids = data.vocab.to_ids(inputs.items)
    histories = [ids[a:b] for a, b in zip(inputs.offsets[:-1], inputs.offsets[1:]) if b > a]
    order = np.random.default_rng(0).permutation(len(histories))
    return [histories[i] for i in order], data.vocab.is_string


def check_answers(layout: str, http_url: str, grpc_url: str, history: np.ndarray, string_ids: bool) -> None:
    """One real request per layout: outputs must be full.

    An empty answer means a broken stub environment (numpy 2), which perf_analyzer alone would not notice.
    """
    served = LAYOUTS[layout]
    if served.request in ("items", "native"):
        with _client(grpc_url, layout) as client:
            ids = client.recommend(history, k=TOP).item_ids.tolist()
    elif served.by_session:
        with _client(grpc_url, layout) as client:
            answer = client.recommend_session(pa.BENCH_SESSION.format(0), k=TOP, model=served.entry)
            if answer.history_length == 0:
                raise ServingError(f"layout {layout}: the store holds no history of the bench's first session")
            ids = answer.item_ids.tolist()
    else:  # the seed ensemble: exactly SEED_HISTORY_LENGTH IDs, no batch dimension
        values = [str(x) if string_ids else int(x) for x in history[-SEED_HISTORY_LENGTH:]]
        data = {
            "name": served.ids_input,
            "shape": [len(values)],
            "datatype": "BYTES" if string_ids else "INT64",
            "data": values,
        }
        request = urllib.request.Request(
            f"http://{http_url}/v2/models/{served.entry}/infer",
            data=json.dumps({"inputs": [data]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                outputs = {o["name"]: o for o in json.load(reply)["outputs"]}
        except urllib.error.HTTPError as err:
            raise ServingError(f"layout {layout}: HTTP {err.code}: {err.read().decode(errors='replace')}") from err
        ids = outputs.get(served.ids_output, {}).get("data", [])
    if len(ids) != TOP:
        raise ServingError(f"layout {layout}: the server answered {ids!r} instead of {TOP} items; see the server log")


def _client(grpc_url: str, layout: str):
    """gRPC: its client needs no gevent, which the HTTP one does (absent where only the server's image is)."""
    from recserve.client.triton import RecommenderClient

    return RecommenderClient(grpc_url, "grpc", model=LAYOUTS[layout].entry, timeout_s=60)


def answers_showing(
    grpc_url: str, layout: str, histories: list[np.ndarray], hidden: set[str], count: int
) -> tuple[int, int] | None:
    """Of up to ``count`` answers to real histories (by session: each in a session of its own), how many show
    an item of ``hidden`` (0 where the hide holds), and how many were checked; None for a layout that does not
    rank (echo, seed)."""
    request = LAYOUTS[layout].request
    if request not in ("items", "native", "session") or layout == "echo":
        return None
    with _client(grpc_url, layout) as client:
        shown, probes = 0, histories[:count]
        for n, history in enumerate(probes):
            if request == "session":
                answer = client.recommend_session(
                    f"hide-probe-{n}", history.tolist(), k=TOP, model=LAYOUTS[layout].entry
                )
            else:
                answer = client.recommend(history, k=TOP)
            shown += bool({str(x) for x in answer.item_ids.tolist()} & hidden)
        return shown, len(probes)


def compare_native(grpc_url: str, histories: list[np.ndarray], count: int = 200, tolerance: float = 1e-3) -> dict:
    """The native layout's top 10 against the fused layout's for ``count`` real histories.

    A position where the two lists differ counts as a tie when the fused scores there are within
    ``tolerance`` of the native ones (reduced precision reorders near-equal scores).

    Raises:
        ServingError: on average fewer than 9 of the fused top 10 in the native answer (a broken model).
    """
    same, overlap, worst = 0, [], 0.0
    with _client(grpc_url, "fused") as fused, _client(grpc_url, "native") as native:
        for history in histories[:count]:
            a, b = fused.recommend(history, k=TOP), native.recommend(history, k=TOP)
            diff = np.abs(a.scores - b.scores) if len(a.scores) == len(b.scores) else np.array([np.inf])
            worst = max(worst, float(diff.max(initial=0.0)))
            same += bool(np.all((a.item_ids == b.item_ids) | (diff <= tolerance))) if len(diff) == TOP else 0
            overlap.append(len(set(a.item_ids.tolist()) & set(b.item_ids.tolist())) / TOP)
    result = {
        "histories": len(overlap),
        "same_top10_ties_aside": same / max(len(overlap), 1),
        "top10_overlap": float(np.mean(overlap)),
        "max_score_diff": worst,
        "tolerance": tolerance,
    }
    if result["top10_overlap"] < 0.9:
        raise ServingError(f"the native layout's answers differ from the fused layout's: {result}")
    return result


def sweep(
    layouts: list[str],
    levels: list[LoadLevel],
    out: Path,
    histories: list[np.ndarray],
    string_ids: bool = False,
    repo: Path | None = None,
    url: str | None = None,
    protocol: str = "grpc",
    measurement_ms: int = 2000,
    slo_p99_ms: float = 50.0,
    client_threads: int | None = None,
    progress: Callable[[str, int, int], None] = lambda *_: None,
    compare_with_fused: bool = False,
    client_cpus: tuple[int, ...] = (),
    events_every: int = 0,
    rules: str | None = None,
    trace_rate: int = 0,
    keep_traces: bool = False,
    run_timeout_s: float | None = None,
) -> dict:
    """Runs every (layout, level); writes summary.json, report.md and the PNGs into ``out``.

    Args:
        histories: the item-ID histories requests are made of (``real_histories`` reads a data folder's).
        repo: a model repository to serve for the run (started on free loopback ports), or
        url: a running server as ``host:http_port,host:grpc_port,host:metrics_port`` (HTTP, gRPC, metrics).
        client_threads: perf_analyzer threads (``--max-threads``); one per usable core when None.
        compare_with_fused: check the native layout's answers against the repository's fused layout even
            when only the native one is swept (they are compared whenever both are).
        client_cpus: cores to pin perf_analyzer to (the server keeps to this process's others); () shares.
        events_every: by session, every Nth request carries an event to append first (0: none).
        rules: business rules to load each layout under besides none (``rule_variants.parse_variants``:
            rule:NAME, exclude:N, include:N, hidden:PCT), each run level by level beside no rule.
        trace_rate: trace one request in N in the server started for ``repo`` (Triton's own traces), and
            give each row ``trace``: its traced requests' stages (``triton_trace.window_summary``); 0: none.
        keep_traces: also keep Triton's trace files (JSON) in ``out``/traces, with each row's window.
        run_timeout_s: how long one perf_analyzer run may take before it is killed (None: ten windows and a
            minute). A run killed so is a failed row, and the sweep stops there with what it measured before
            (``stopped`` in the summary says where): a server that stopped answering would stall every level.
    """
    from recserve.bench.load_report import ratios, write_report
    from recserve.bench.rule_variants import (
        HIDE_PROBES,
        NONE,
        hidden_for,
        parse_variants,
        repository_catalogue,
        rule_overhead,
    )

    variants = parse_variants(rules)
    catalogue = np.zeros(0, dtype=np.int64)  # the repository's, where a variant lists or hides items
    if len(variants) > 1:
        if repo is None:
            raise ServingError("--rules needs --repo: its catalogue makes the listed items, its store the hidden")
        catalogue = repository_catalogue(repo)

    unknown = [x for x in layouts if x not in LAYOUTS]
    if unknown:
        raise ServingError(f"layout {', '.join(unknown)}: expected any of {', '.join(LAYOUTS)}")
    if (repo is None) == (url is None):
        raise ServingError("pass either a repository to serve or the url of a running server")
    if trace_rate and repo is None:
        raise ServingError("tracing needs --repo: only a server the sweep starts is traced")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    client_threads = client_threads or pa.default_client_threads()
    rows: list[dict] = []
    windows: list[tuple[dict, int, int]] = []  # (row, its load's start and end, steady clock ns)
    stopped = ""  # why the sweep stopped before its last level, where it did
    traces_dir = tempfile.TemporaryDirectory()  # removed once read, after the server has stopped
    trace_file = Path(traces_dir.name) / "trace.json"
    with _server(repo, url, trace_args(trace_file, trace_rate) if trace_rate else ()) as (
        http_url,
        grpc_url,
        metrics_url,
        server_pid,
        server_log,
    ):
        meter = CpuMeter(server_pid)
        target = grpc_url if protocol == "grpc" else http_url
        with tempfile.TemporaryDirectory() as tmp:
            inputs: dict[tuple[str, str], Path] = {}
            store_record = None
            by_session = [x for x in layouts if LAYOUTS[x].by_session]
            if by_session:  # the store (the repository's record names it) holds the same histories
                if repo is None:
                    raise ServingError("a sweep by session needs --repo (its record names the store)")
                records = read_repository_info(repo)["layouts"]
                stores = {}
                for layout in by_session:
                    store = records.get(layout, {}).get("session_store")
                    if not store:
                        raise ServingError(f"{repo}: no {layout} layout with a store in its record")
                    stores[json.dumps(store, sort_keys=True)] = store  # layouts of one store load it once
                for store in stores.values():
                    pa.load_bench_sessions(store, histories)
            if repo is not None and any(v.kind == "hidden" for v in variants):
                store_record = store_of(read_repository_info(repo))
            for layout in layouts:
                history = next(h for h in histories if len(h) >= SEED_HISTORY_LENGTH)
                check_answers(layout, http_url, grpc_url, history, string_ids)
                native = None
                if LAYOUTS[layout].request == "native":
                    with _client(grpc_url, layout) as client:
                        native = client.native_shape()
                for variant in variants:
                    if variant.name == NONE:
                        extra = None
                    else:  # request n's rule inputs beside its history
                        extra = lambda n, v=variant: v.inputs(n, catalogue, string_ids)  # noqa: E731
                    inputs[layout, variant.name] = Path(tmp) / f"{layout}-{len(inputs)}.json"
                    pa.write_input_data(
                        histories,
                        layout,
                        inputs[layout, variant.name],
                        string_ids,
                        native=native,
                        events_every=events_every,
                        extra=extra,
                    )
            compare = "native" in layouts and ("fused" in layouts or compare_with_fused)
            agreement = compare_native(grpc_url, histories) if compare else None
            # level by level, every layout in turn: the runs a ratio compares are minutes apart at most,
            # so a shared host's drift moves both sides of it
            total = len(layouts) * len(levels) * len(variants)

            def measure(layout: str, level: LoadLevel, input_file: Path) -> dict:
                before, cpu_before = pa.model_statistics(http_url), meter.snapshot()
                started = time.monotonic_ns()
                result = pa.run(
                    LAYOUTS[layout].entry,
                    target,
                    protocol,
                    level,
                    input_file,
                    measurement_ms,
                    Path(tmp) / "pa.csv",
                    timeout_s=run_timeout_s or measurement_ms / 1000 * 10 + 60,
                    client_threads=client_threads,
                    client_cpus=client_cpus,
                )
                if result.get("timed_out"):  # a server that stopped answering may not give statistics either
                    return {"layout": layout, level.kind: level.value, **result}
                steps = pa.step_breakdown(before, pa.model_statistics(http_url), STEPS[layout])
                cpu = meter.per_request(cpu_before, steps.get(LAYOUTS[layout].entry, {}).get("requests", 0))
                failures = sum(s["failures"] for s in steps.values())
                window = (started, time.monotonic_ns())
                row = {
                    "layout": layout,
                    level.kind: level.value,
                    **result,
                    "errors": result["errors"] + failures,
                    "steps": steps,
                    "cpu_us_per_request": cpu,
                }
                windows.append((row, *window))
                return row

            for level, variant in ((level, variant) for level in levels for variant in variants):
                if stopped:
                    break
                with hidden_for(variant, store_record, catalogue) as hidden:
                    for layout in layouts:
                        label = f"{layout} {level.kind} {level.value:g}"
                        progress(label + ("" if variant.name == NONE else f" {variant.name}"), len(rows), total)
                        row = measure(layout, level, inputs[layout, variant.name])
                        if variant.name != NONE:
                            row |= {"rules": variant.name, "hidden_items": len(hidden)}
                        rows.append(row)
                        if row.get("timed_out"):  # a server that stopped answering: what was measured is kept
                            stopped = f"{label}: {row['error']}; the levels after it were not run"
                            log.warning("sweep stopped at %s", stopped)
                            break
                        if hidden:  # what was measured kept to the hide: answers after it never show one
                            probed = answers_showing(grpc_url, layout, histories, hidden, HIDE_PROBES)
                            if probed is not None:
                                row["answers_showing_hidden"], row["answers_probed"] = probed
        try:
            metrics = pa.metrics_text(metrics_url)
        except OSError:  # a server that stopped answering: the rows measured before stay
            if not stopped:
                raise
            metrics = None
    with traces_dir:  # the server has stopped: every trace is written
        if trace_rate:
            traces = read_traces(trace_file)
            for row, start, end in windows:
                row["trace"] = window_summary(traces, LAYOUTS[row["layout"]].entry, start, end)
                if keep_traces:
                    row["trace"]["window_ns"] = [start, end]
            if keep_traces:
                (out / "traces").mkdir(exist_ok=True)
                for file in trace_file.parent.glob(trace_file.name + "*"):
                    shutil.copy(file, out / "traces" / file.name)
    rows.sort(key=lambda r: layouts.index(r["layout"]))  # the report reads layout by layout (a stable sort)
    summary = {
        "results": rows,
        "server_log": str(server_log) if server_log else None,  # the server the sweep started: its log
        **({"stopped": stopped} if stopped else {}),
        "settings": {
            "protocol": protocol,
            "measurement_ms": measurement_ms,
            "slo_p99_ms": slo_p99_ms,
            "client_threads": client_threads,
            "layouts": layouts,
            "requests_from": f"{len(histories)} histories",
            "events_every": events_every,
            **({"rules": [v.name for v in variants]} if len(variants) > 1 else {}),
        },
        "server_failures": {  # None: the server no longer answered for its metrics
            layout: None if metrics is None else pa.failures_from_metrics(metrics, LAYOUTS[layout].entry)
            for layout in layouts
        },
    }
    if agreement is not None:
        summary["native_vs_fused"] = agreement
    summary["ratios"] = ratios([r for r in rows if "rules" not in r], slo_p99_ms)
    if len(variants) > 1:
        summary["rule_overhead"] = rule_overhead(rows, slo_p99_ms)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_report(summary, out / "report.md")
    try:
        from recserve.bench.plots import plot_summary
    except ImportError:  # a machine without matplotlib: plot later with `python -m recserve.bench.plots`
        log.warning("matplotlib is missing: no plots written")
    else:
        plot_summary(out / "summary.json", out)
    return summary


def _server(repo: Path | None, url: str | None, server_args: tuple[str, ...] = ()):
    if url is not None:
        parts = url.split(",")
        if len(parts) != 3:
            raise ServingError(f"url {url!r}: expected host:http_port,host:grpc_port,host:metrics_port")
        return nullcontext((*parts, None, None))  # another host's or process's server: no CPU accounting, no log
    assert repo is not None  # sweep() takes one of the two
    return _started(repo, server_args)


class _started:
    """Serves ``repo`` on free loopback ports for the length of the sweep (``server_args``: more options)."""

    def __init__(self, repo: Path, server_args: tuple[str, ...] = ()):
        from recserve.processes import free_ports
        from recserve.serving.triton_server.launcher import ServerSettings, TritonServer

        http, grpc, metrics = free_ports(3)
        settings = ServerSettings(http_port=http, grpc_port=grpc, metrics_port=metrics, extra_args=server_args)
        self.server = TritonServer(repo, settings)

    def __enter__(self):
        self.server.__enter__()
        s = self.server.settings
        server = self.server
        return server.http_url, server.grpc_url, f"{s.host}:{s.metrics_port}", server.process.pid, server.log_path

    def __exit__(self, *exc):
        self.server.__exit__(*exc)
