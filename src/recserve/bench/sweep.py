"""``recserve bench``: perf_analyzer over layouts and load levels against a real server, with checks and stats.

``sweep`` starts (or reaches) the server and hands the runs to ``level_runs``; the answers' checks are
``answer_checks``'; the traces ``triton_trace``'s; the summary and report ``load_report``'s."""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from recserve.artifacts.served import LAYOUTS
from recserve.bench import perf_analyzer as pa
from recserve.bench.answer_checks import compare_native
from recserve.bench.level_runs import Runs, Served, request_files, rules_catalogue, run_levels
from recserve.bench.load_report import protocol_ratios, ratios, write_report
from recserve.bench.load_settings import LoadSettings
from recserve.bench.perf_analyzer import LoadLevel
from recserve.bench.rule_variants import RuleVariant, parse_variants, rule_overhead
from recserve.bench.triton_trace import TraceFiles
from recserve.errors import ServingError
from recserve.host import describe as describe_host

log = logging.getLogger(__name__)


def real_histories(data_dir: Path) -> tuple[list[np.ndarray], bool]:
    """Every user's test-time history as item IDs (the real length and ID distribution)."""
    from recserve.data.datasets import load_prepared

    data = load_prepared(data_dir)
    inputs = data.sequences.truncated(1)
    ids = data.vocab.to_ids(inputs.items)
    histories = [ids[a:b] for a, b in zip(inputs.offsets[:-1], inputs.offsets[1:]) if b > a]
    order = np.random.default_rng(0).permutation(len(histories))
    return [histories[i] for i in order], data.vocab.is_string


def sweep(
    layouts: list[str],
    levels: list[LoadLevel],
    out: Path,
    histories: list[np.ndarray],
    string_ids: bool = False,
    repo: Path | None = None,
    url: str | None = None,
    load: LoadSettings = LoadSettings(),
    progress: Callable[[str, int, int], None] = lambda *_: None,
) -> dict:
    """Runs every (layout, level, rule variant); writes summary.json, report.md and the PNGs into ``out``.

    Args:
        histories: the item-ID histories requests are made of (``real_histories`` reads a data folder's).
        repo: a model repository to serve for the run (started on free loopback ports), or
        url: a running server as ``host:http_port,host:grpc_port,host:metrics_port`` (HTTP, gRPC, metrics).
        load: every knob of the load (``LoadSettings``): its protocol, windows, threads and cores, SLO, events,
            rules, traces, and each run's limit. A run killed by that limit is a failed row, and the sweep stops
            there with what it measured before (``stopped`` in the summary says where): a server that stopped
            answering would stall every level.
    """
    variants = parse_variants(load.rules)
    _refuse_what_cannot_run(layouts, repo, url, load)
    out, load = Path(out), load.with_client_threads()
    out.mkdir(parents=True, exist_ok=True)
    catalogue = rules_catalogue(repo, variants)
    with TraceFiles(load.trace_rate) as traces:
        with _server(repo, url, traces.server_args) as server, tempfile.TemporaryDirectory() as tmp:
            inputs = request_files(server, layouts, variants, histories, string_ids, repo, load, catalogue, Path(tmp))
            compare = "native" in layouts and ("fused" in layouts or load.compare_with_fused)
            agreement = compare_native(server.grpc_url, histories) if compare else None
            runs = run_levels(
                server, layouts, levels, variants, inputs, histories, repo, load, progress, catalogue, Path(tmp)
            )
            metrics = _metrics_unless_stopped(server, runs.stopped)
        traces.summarize(runs.windows, out if load.keep_traces else None)  # the server has stopped: all written
    runs.rows.sort(key=lambda r: layouts.index(r["layout"]))  # the report reads layout by layout (a stable sort)
    summary = _summary(runs, layouts, variants, f"{len(histories)} histories", load, metrics, server.log)
    if agreement is not None:
        summary["native_vs_fused"] = agreement
    _write(summary, out)
    return summary


def _refuse_what_cannot_run(layouts: list[str], repo: Path | None, url: str | None, load: LoadSettings) -> None:
    unknown = [x for x in layouts if x not in LAYOUTS]
    if unknown:
        raise ServingError(f"layout {', '.join(unknown)}: expected any of {', '.join(LAYOUTS)}")
    if (repo is None) == (url is None):
        raise ServingError("pass either a repository to serve or the url of a running server")
    if load.trace_rate and repo is None:
        raise ServingError("tracing needs --repo: only a server the sweep starts is traced")
    load.protocols()  # a protocol that is neither grpc nor http, refused before a server starts


def _metrics_unless_stopped(server: Served, stopped: str) -> str | None:
    """The server's metrics text; None where it stopped answering (the rows measured before stay)."""
    try:
        return pa.metrics_text(server.metrics_url)
    except OSError:
        if not stopped:
            raise
        return None


def _summary(
    runs: Runs,
    layouts: list[str],
    variants: list[RuleVariant],
    requests_from: str,
    load: LoadSettings,
    metrics: str | None,
    server_log: Path | None,
) -> dict:
    """summary.json's content: the rows, the settings, the server's failures by its metrics, the ratios, and
    the rules' cost where the sweep ran rule variants."""
    protocol = load.protocols()[0]
    first = [r for r in runs.rows if r.get("protocol", protocol) == protocol]  # the rows its ratios compare
    summary = {
        "results": runs.rows,
        "server_log": str(server_log) if server_log else None,  # the server the sweep started: its log
        "host": describe_host(),  # the server's path follows the host's CPU: the figures carry it
        **({"stopped": runs.stopped} if runs.stopped else {}),
        "settings": {
            "protocol": load.protocol,
            "measurement_ms": load.measurement_ms,
            "slo_p99_ms": load.slo_p99_ms,
            "client_threads": load.client_threads,
            "layouts": layouts,
            "requests_from": requests_from,
            "events_every": load.events_every,
            **({"rules": [v.name for v in variants]} if len(variants) > 1 else {}),
        },
        "server_failures": {  # None: the server no longer answered for its metrics
            layout: None if metrics is None else pa.failures_from_metrics(metrics, LAYOUTS[layout].entry)
            for layout in layouts
        },
        # the layouts against each other over the first protocol; HTTP against gRPC, where both ran, beside
        "ratios": ratios([r for r in first if "rules" not in r], load.slo_p99_ms),
        "http_over_grpc": protocol_ratios(runs.rows),
    }
    if len(variants) > 1:
        summary["rule_overhead"] = rule_overhead(first, load.slo_p99_ms)
    return summary


def _write(summary: dict, out: Path) -> None:
    """summary.json, report.md and the plots (where matplotlib is)."""
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_report(summary, out / "report.md")
    try:
        from recserve.bench.plots import plot_summary
    except ImportError:  # a machine without matplotlib: plot later with `python -m recserve.bench.plots`
        log.warning("matplotlib is missing: no plots written")
    else:
        plot_summary(out / "summary.json", out)


def _server(repo: Path | None, url: str | None, server_args: tuple[str, ...] = ()):
    if url is not None:
        parts = url.split(",")
        if len(parts) != 3:
            raise ServingError(f"url {url!r}: expected host:http_port,host:grpc_port,host:metrics_port")
        http_url, grpc_url, metrics_url = parts  # another host's or process's server: no CPU accounting, no log
        return nullcontext(Served(http_url, grpc_url, metrics_url))
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
        server = self.server.__enter__()
        metrics_url = f"{server.settings.host}:{server.settings.metrics_port}"
        return Served(server.http_url, server.grpc_url, metrics_url, server.process.pid, server.log_path)

    def __exit__(self, *exc):
        self.server.__exit__(*exc)
