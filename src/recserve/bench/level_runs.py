"""A sweep's runs against one server: the request files of each (layout, rule variant), then every load level
in turn, each rule variant under it (a hide set up in the store for its runs), each layout at it: one
perf_analyzer run with the server's statistics and its CPU time around it, and, under a hide, answers probed
after it. Level by level, every layout in turn: the runs a ratio compares are minutes apart at most, so a
shared host's drift moves both sides of it."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recserve.artifacts.repository_record import read_repository_info, store_of
from recserve.artifacts.served import LAYOUTS
from recserve.bench import perf_analyzer as pa
from recserve.bench.answer_checks import answers_showing, check_answers, client_of
from recserve.bench.cpu import CpuMeter
from recserve.bench.load_settings import LoadSettings
from recserve.bench.perf_analyzer import LoadLevel
from recserve.bench.rule_variants import HIDE_PROBES, NONE, RuleVariant, hidden_for, repository_catalogue
from recserve.constants import SEED_HISTORY_LENGTH
from recserve.errors import ServingError

STEPS = {name: list(layout.models) for name, layout in LAYOUTS.items()}  # whose statistics a row reads

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """The server a sweep loads: its addresses, and its process and log where the sweep started it."""

    http_url: str
    grpc_url: str
    metrics_url: str
    pid: int | None = None
    log: Path | None = None


@dataclass
class Runs:
    """What the runs measured: one row a run, each measured row's load window (steady clock ns), and why the
    runs stopped before the last level, where they did."""

    rows: list[dict] = field(default_factory=list)
    windows: list[tuple[dict, int, int]] = field(default_factory=list)
    stopped: str = ""


def rules_catalogue(repo: Path | None, variants: list[RuleVariant]) -> np.ndarray:
    """The repository's catalogue, where a rule variant lists or hides its items (none without variants)."""
    if len(variants) == 1:
        return np.zeros(0, dtype=np.int64)
    if repo is None:
        raise ServingError("--rules needs --repo: its catalogue makes the listed items, its store the hidden")
    return repository_catalogue(repo)


def run_levels(
    server: Served,
    layouts: list[str],
    levels: list[LoadLevel],
    variants: list[RuleVariant],
    inputs: dict[tuple[str, str], Path],
    histories: list[np.ndarray],
    repo: Path | None,
    load: LoadSettings,
    progress: Callable[[str, int, int], None],
    catalogue: np.ndarray,
    scratch: Path,
) -> Runs:
    """Every (level, rule variant, layout) against ``server`` with ``request_files``' inputs; stops at a run
    the server no longer answered."""
    hidden_store = store_of(read_repository_info(repo)) if repo and any(v.kind == "hidden" for v in variants) else None
    protocols = load.protocols()
    runs, meter = Runs(), CpuMeter(server.pid)
    total = len(layouts) * len(levels) * len(variants) * len(protocols)
    for level, variant in ((level, variant) for level in levels for variant in variants):
        with hidden_for(variant, hidden_store, catalogue) as hidden:
            for layout, protocol in ((x, p) for x in layouts for p in protocols):
                label = f"{layout} {level.kind} {level.value:g}" + (f" {protocol}" if len(protocols) > 1 else "")
                progress(label + ("" if variant.name == NONE else f" {variant.name}"), len(runs.rows), total)
                file = inputs[layout, variant.name]
                row = _measure(server, load, meter, runs, layout, level, file, scratch, protocol)
                if variant.name != NONE:
                    row |= {"rules": variant.name, "hidden_items": len(hidden)}
                if len(protocols) > 1:
                    row["protocol"] = protocol
                runs.rows.append(row)
                if row.get("timed_out"):  # a server that stopped answering: what was measured is kept
                    runs.stopped = f"{label}: {row['error']}; the levels after it were not run"
                    log.warning("sweep stopped at %s", runs.stopped)
                    return runs
                probed = answers_showing(server.grpc_url, layout, histories, hidden, HIDE_PROBES) if hidden else None
                if probed is not None:  # what was measured kept to the hide: answers after it never show one
                    row["answers_showing_hidden"], row["answers_probed"] = probed
    return runs


def request_files(
    server: Served,
    layouts: list[str],
    variants: list[RuleVariant],
    histories: list[np.ndarray],
    string_ids: bool,
    repo: Path | None,
    load: LoadSettings,
    catalogue: np.ndarray,
    scratch: Path,
) -> dict[tuple[str, str], Path]:
    """perf_analyzer's input file of each (layout, rule variant), each layout's answer checked first; by
    session, the histories loaded into the store the repository's record names."""
    _load_sessions([x for x in layouts if LAYOUTS[x].by_session], histories, repo)
    inputs: dict[tuple[str, str], Path] = {}
    for layout in layouts:
        history = next(h for h in histories if len(h) >= SEED_HISTORY_LENGTH)
        check_answers(layout, server.http_url, server.grpc_url, history, string_ids)
        native = None
        if LAYOUTS[layout].request == "native":
            with client_of(server.grpc_url, layout) as client:
                native = client.native_shape()
        for variant in variants:
            extra = None if variant.name == NONE else (lambda n, v=variant: v.inputs(n, catalogue, string_ids))
            inputs[layout, variant.name] = scratch / f"{layout}-{len(inputs)}.json"
            pa.write_input_data(
                histories,
                layout,
                inputs[layout, variant.name],
                string_ids,
                native=native,
                events_every=load.events_every,
                extra=extra,
            )
    return inputs


def _load_sessions(by_session: list[str], histories: list[np.ndarray], repo: Path | None) -> None:
    """The store of each layout by session (its record names it) holds the same histories, loaded once."""
    if not by_session:
        return
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


def _measure(
    server: Served,
    load: LoadSettings,
    meter: CpuMeter,
    runs: Runs,
    layout: str,
    level: LoadLevel,
    input_file: Path,
    scratch: Path,
    protocol: str,
) -> dict:
    """One perf_analyzer run over ``protocol``: its figures, the server's steps and failures over it, its CPU
    a request."""
    target = server.grpc_url if protocol == "grpc" else server.http_url
    before, cpu_before, started = pa.model_statistics(server.http_url), meter.snapshot(), time.monotonic_ns()
    result = pa.run(
        LAYOUTS[layout].entry,
        target,
        protocol,
        level,
        input_file,
        load.measurement_ms,
        scratch / "pa.csv",
        timeout_s=load.run_limit_s(),
        client_threads=load.client_threads,
        client_cpus=load.client_cpus,
    )
    if result.get("timed_out"):  # a server that stopped answering may not give statistics either
        return {"layout": layout, level.kind: level.value, **result}
    steps = pa.step_breakdown(before, pa.model_statistics(server.http_url), STEPS[layout])
    row = {
        "layout": layout,
        level.kind: level.value,
        **result,
        "errors": result["errors"] + sum(s["failures"] for s in steps.values()),
        "steps": steps,
        "cpu_us_per_request": meter.per_request(cpu_before, steps.get(LAYOUTS[layout].entry, {}).get("requests", 0)),
    }
    runs.windows.append((row, started, time.monotonic_ns()))
    return row
