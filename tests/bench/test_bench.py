"""A short real benchmark: perf_analyzer against a real server, one load level, a few seconds a layout."""

import json
from pathlib import Path

import pytest
from tests.conftest import SERVED_LAYOUTS, needs_native_backends

from recserve.bench.load_report import ratios
from recserve.bench.load_settings import LoadSettings
from recserve.bench.perf_analyzer import LoadLevel, find_perf_analyzer
from recserve.bench.sweep import real_histories, sweep
from recserve.bench.triton_trace import read_traces, trace_args
from recserve.errors import ServingError

TRACE_RATE = 20


@pytest.fixture(scope="module")
def summary(int_repo, ml100k_dir, tmp_path_factory):
    try:
        find_perf_analyzer()
    except ServingError as err:
        pytest.fail(f"{err} (make test installs it)")
    out = tmp_path_factory.mktemp("bench")
    histories, string_ids = real_histories(ml100k_dir)
    result = sweep(
        list(SERVED_LAYOUTS),
        [LoadLevel("concurrency", 4)],
        out,
        histories,
        string_ids,
        repo=int_repo,
        # one request in 20 traced, as docs/benchmarks.md advises: denser tracing fails a request now and then
        load=LoadSettings(measurement_ms=800, slo_p99_ms=1000, client_threads=2, trace_rate=TRACE_RATE),
    )
    return out, result


def test_report_files_exist_and_hold_sane_numbers(summary):
    out, result = summary
    for name in ("summary.json", "report.md", "throughput_latency.png", "steps.png"):
        assert (out / name).stat().st_size > 0, name
    rows = json.loads((out / "summary.json").read_text())["results"]
    assert [r["layout"] for r in rows] == list(SERVED_LAYOUTS)
    for row in rows:
        assert row["errors"] == 0, row
        assert row["concurrency"] == 4 and row["throughput_rps"] > 10
        assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"] < 5000
        cpu = row["cpu_us_per_request"]  # every process group did work for every request
        assert 0 < cpu["client"] < 1e5 and 0 < cpu["server"] < 1e5, cpu
        if row["layout"] != "native":
            assert 0 < cpu["models"] < 1e5, cpu
    fused_models = next(r for r in rows if r["layout"] == "fused")["cpu_us_per_request"]["models"]
    for row in rows:  # a native model runs inside the server: the model processes (other layouts') stay idle
        if row["layout"] == "native":  # (a Python model would spend about what fused's does)
            assert row["cpu_us_per_request"]["models"] < 0.5 * fused_models, row["cpu_us_per_request"]
    assert result["server_failures"] == dict.fromkeys(SERVED_LAYOUTS, 0)
    assert "successfully loaded" in Path(result["server_log"]).read_text()  # the log of the server it started
    assert "## CPU per request" in (out / "report.md").read_text()
    assert result["settings"]["client_threads"] == 2 and "2 client threads" in (out / "report.md").read_text()
    host = result["host"]  # the figures carry the host they were measured on
    assert host["cpu"] and host["cores"] >= 1 and f"Host: {host['cpu']}" in (out / "report.md").read_text()


@needs_native_backends
def test_per_step_breakdown_covers_every_ensemble_step(summary):
    _, result = summary
    seed = next(r for r in result["results"] if r["layout"] == "seed")
    steps = seed["steps"]
    assert set(steps) == {"bert4rec_ensemble", "bert4rec_preprocessing", "bert4rec", "bert4rec_postprocessing"}
    counts = {name: step["requests"] for name, step in steps.items()}
    assert min(counts.values()) > 0.9 * max(counts.values()) > 0, counts  # every request passes every step
    assert all(steps[name]["compute_infer_ms"] > 0 for name in counts if name != "bert4rec_ensemble"), steps
    fused = next(r for r in result["results"] if r["layout"] == "fused")
    assert fused["steps"]["recommender"]["requests"] > 0 and fused["steps"]["recommender"]["compute_infer_ms"] > 0


@needs_native_backends
def test_the_bench_checks_native_answers_against_fused(summary):
    out, result = summary
    agreement = result["native_vs_fused"]
    assert agreement["histories"] == 200 and agreement["same_top10_ties_aside"] == 1.0, agreement
    assert "native against fused, 200 real histories" in (out / "report.md").read_text()
    assert set(result["ratios"]["native_over_fused"]) == {"concurrency=4"}


@needs_native_backends
def test_ratios_compare_layouts_at_the_same_level(summary):
    _, result = summary
    assert set(result["ratios"]["fused_over_seed"]) == {"concurrency=4"}
    row = {r["layout"]: r for r in result["results"]}  # the ratio is the measured rows' own
    got = result["ratios"]["fused_over_seed"]["concurrency=4"]
    assert got["throughput"] == pytest.approx(row["fused"]["throughput_rps"] / row["seed"]["throughput_rps"])
    assert got["p99"] == pytest.approx(row["fused"]["p99_ms"] / row["seed"]["p99_ms"])
    assert "fused" in (json.dumps(result["ratios"]["best_within_slo"]))


def test_traced_requests_are_taken_apart_stage_by_stage(summary):
    out, result = summary
    for row in result["results"]:
        trace = row["trace"]
        if row["layout"] == "seed":  # an ensemble's request is traced model by model: not taken apart
            assert trace == {"traces": 0}, trace
            continue
        # one request in TRACE_RATE of those perf_analyzer sent in the window (its warm-up too)
        assert 0.2 * row["throughput_rps"] * 0.8 / TRACE_RATE < trace["traces"], (row["layout"], trace)
        p50, tail = trace["p50_ms"], trace["slowest"]["mean_ms"]
        assert set(p50) == {"frontend", "queue", "input", "infer", "answer", "server"}
        assert all(v >= 0 for v in p50.values()) and 0 < p50["server"] <= trace["p99_ms"]["server"], trace
        # the stages add up to the server's time, and the slowest hundredth is slower than the median
        stages = sum(v for name, v in tail.items() if name != "server")
        assert stages == pytest.approx(tail["server"], rel=1e-6) and tail["server"] >= p50["server"], trace
        assert p50["server"] < row["p99_ms"], (row, trace)  # the server's share is within the client's latency
    report = (out / "report.md").read_text()
    assert "## Where the traced requests spent their time" in report and "slowest 1%" in report


def test_a_run_that_runs_past_its_bound_stops_the_sweep_with_what_it_measured(int_repo, ml100k_dir, tmp_path):
    histories, string_ids = real_histories(ml100k_dir)
    levels = [LoadLevel("concurrency", 1), LoadLevel("concurrency", 2)]
    # a bound no run can keep: perf_analyzer is killed in its first window, and the sweep returns what it has
    load = LoadSettings(run_timeout_s=0.3)
    result = sweep(["fused"], levels, tmp_path, histories, string_ids, repo=int_repo, load=load)
    (row,) = result["results"]  # the second level was not run
    assert row["timed_out"] and row["errors"] == 1 and "perf_analyzer ran past 0 s" in row["error"], row
    assert result["stopped"] == f"fused concurrency 1: {row['error']}; the levels after it were not run"
    report = (tmp_path / "report.md").read_text()
    assert "failed: perf_analyzer ran past" in report and "The sweep stopped early: fused concurrency 1" in report


@needs_native_backends
def test_the_floor_answers_every_request_beside_native_and_the_models_cost_reads_against_it(
    int_repo, ml100k_dir, tmp_path
):
    """The floor (recserve's backend without a graph) swept beside native, untraced (Triton's traces of one
    request in 3 failed a request now and then under load): every request answered, native
    over floor in the ratios and the report."""
    histories, string_ids = real_histories(ml100k_dir)
    load = LoadSettings(measurement_ms=800, slo_p99_ms=1000, client_threads=2)
    result = sweep(
        ["native", "floor"], [LoadLevel("concurrency", 4)], tmp_path, histories, string_ids, int_repo, load=load
    )
    for row in result["results"]:
        assert row["errors"] == 0 and row["throughput_rps"] > 10, row
    assert result["server_failures"] == {"native": 0, "floor": 0}
    native_over_floor = result["ratios"]["native_over_floor"]["concurrency=4"]
    assert native_over_floor["throughput"] > 0 and "native over floor" in (tmp_path / "report.md").read_text()


def test_a_sweep_over_both_protocols_runs_each_layout_over_each_and_compares_them(int_repo, ml100k_dir, tmp_path):
    """--protocol grpc,http: every run over gRPC and over HTTP in turn (what a Java or Go client and a JSON one
    send), labelled so in the rows, the report and the plots; the layouts' ratios over gRPC, HTTP against it."""
    histories, string_ids = real_histories(ml100k_dir)
    load = LoadSettings(protocol="grpc,http", measurement_ms=300, client_threads=1, slo_p99_ms=1000)
    result = sweep(
        ["fused", "echo"], [LoadLevel("concurrency", 1)], tmp_path, histories, string_ids, int_repo, load=load
    )
    rows = result["results"]
    assert [(r["layout"], r["protocol"]) for r in rows] == [
        ("fused", "grpc"),
        ("fused", "http"),
        ("echo", "grpc"),
        ("echo", "http"),
    ]
    assert all(r["errors"] == 0 and r["throughput_rps"] > 0 for r in rows)
    assert set(result["http_over_grpc"]) == {"fused", "echo"}
    assert result["ratios"]["fused_over_echo"]["concurrency=1"]["throughput"] > 0  # over gRPC alone
    report = (tmp_path / "report.md").read_text()
    assert "| fused over http | concurrency 1 |" in report and "fused over HTTP against gRPC at concurrency=1" in report
    with pytest.raises(ServingError, match="protocol 'grpc,soap': expected grpc, http or grpc,http"):
        sweep(
            ["fused"],
            [LoadLevel("concurrency", 1)],
            tmp_path,
            [],
            url="a:1,a:2,a:3",
            load=LoadSettings(protocol="grpc,soap"),
        )


def test_a_trace_file_that_is_not_one_is_refused(tmp_path):
    (tmp_path / "trace.json").write_text('{"not": "a list"}')
    with pytest.raises(ValueError, match="not a Triton trace file"):
        read_traces(tmp_path / "trace.json")
    with pytest.raises(ValueError, match="trace rate 0"):
        trace_args(tmp_path / "trace.json", 0)
    with pytest.raises(ServingError, match="tracing needs --repo"):
        load = LoadSettings(trace_rate=10)
        sweep(["native"], [LoadLevel("concurrency", 1)], tmp_path, [], url="a:1,a:2,a:3", load=load)


def test_ratios_formula():
    rows = [
        {"layout": "fused", "concurrency": 8, "throughput_rps": 300.0, "p50_ms": 4.0, "p99_ms": 10.0, "errors": 0},
        {"layout": "seed", "concurrency": 8, "throughput_rps": 100.0, "p50_ms": 9.0, "p99_ms": 40.0, "errors": 0},
        {"layout": "echo", "concurrency": 8, "throughput_rps": 400.0, "p50_ms": 2.0, "p99_ms": 5.0, "errors": 0},
        {"layout": "native", "concurrency": 8, "throughput_rps": 600.0, "p50_ms": 1.0, "p99_ms": 2.0, "errors": 0},
        {"layout": "native_session", "concurrency": 8, "throughput_rps": 480.0, "p50_ms": 1.25, "p99_ms": 3.0},
    ]
    r = ratios(rows, slo_p99_ms=20)
    assert r["native_over_fused"]["concurrency=8"] == {"throughput": 2.0, "p99": 0.2, "p50_ms_more": -3.0}
    # by session against the same layout by items
    assert r["native_session_over_native"]["concurrency=8"] == {"throughput": 0.8, "p99": 1.5, "p50_ms_more": 0.25}
    assert r["native_over_echo"]["concurrency=8"]["throughput"] == 1.5 and r["best_native_over_best_echo"] == 1.5
    assert r["fused_over_seed"]["concurrency=8"] == {"throughput": 3.0, "p99": 0.25, "p50_ms_more": -5.0}
    assert r["fused_over_echo"]["concurrency=8"]["throughput"] == 0.75
    assert r["best_within_slo"]["seed"] is None and r["best_within_slo"]["fused"]["throughput_rps"] == 300.0


def test_a_rule_variant_run_in_rounds_is_compared_round_by_round():
    from recserve.bench.rule_variants import rule_overhead

    def row(p50, rps, rules=None, concurrency=1):
        r = {"layout": "native", "concurrency": concurrency, "throughput_rps": rps, "p50_ms": p50, "p99_ms": 2.0}
        return r | ({"rules": rules} if rules else {})

    # three rounds at concurrency 1 (each: none, then the rule), one at 16; the host's p50 drifts by round
    rule = "exclude:100"
    rows = [row(1.5, 600.0), row(1.6, 570.0, rule), row(1.3, 700.0), row(1.35, 700.0, rule)]
    rows += [row(1.4, 650.0), row(1.7, 520.0, rule), row(2.0, 8000.0, None, 16), row(2.1, 7200.0, rule, 16)]
    levels = rule_overhead(rows, slo_p99_ms=10)["native"]["exclude:100"]["levels"]
    one = levels["concurrency=1"]  # round by round +0.10, +0.05, +0.30: the median, not the last round's
    assert one["p50_ms_more"] == pytest.approx(0.10) and one["throughput"] == pytest.approx(0.95) and one["rounds"] == 3
    assert levels["concurrency=16"] == {"p50_ms_more": pytest.approx(0.1), "throughput": pytest.approx(0.9)}
    rows[2] = {"layout": "native", "concurrency": 1, "errors": 1, "error": "failed"}  # round 2's none failed
    one = rule_overhead(rows, slo_p99_ms=10)["native"][rule]["levels"]["concurrency=1"]
    assert one["rounds"] == 2 and one["p50_ms_more"] == pytest.approx(0.2)  # rounds 1 and 3, each with its own


def test_steps_beside_none_compare_periods_of_one_kind_only():
    from recserve.bench.step_log import read_step_lines, steps_beside_none

    def line(batches, ruled, graph, inputs):
        steps = f"requests 0.010/0.020/0.030, inputs {inputs}/0.1/0.2, graph {graph}/0.9/1.0"
        head = f"recserve backend: m_0_0: batches {batches} in 10.0 s, under rules {ruled}"
        return f'I1206 recserve.cc:1354] "{head}; ms a batch, p50/p99/max: {steps}"'

    log = "\n".join(
        [
            line(1, 0, 0.9, 0.04),  # the first batch's: too few batches
            line(1000, 0, 0.50, 0.035),
            line(1000, 0, 0.52, 0.037),
            line(1000, 400, 0.70, 0.06),  # both kinds: left out
            line(1000, 1000, 0.57, 0.048),
            "an unrelated line",
        ]
    )
    lines = read_step_lines(log)
    assert len(lines) == 5 and lines[1]["steps"]["graph"] == (0.50, 0.9, 1.0)
    got = steps_beside_none(lines)
    assert got["none"]["periods"] == 2 and got["ruled"]["periods"] == 1
    assert got["more_ms"]["graph"] == pytest.approx(0.06) and got["more_ms"]["inputs"] == pytest.approx(0.012)
    assert got["more_ms"]["all"] == pytest.approx(0.06 + 0.012 + 0.0)
    with pytest.raises(ValueError, match="ran ruled alone"):
        steps_beside_none(lines[:4])


def test_bad_layout_is_refused(tmp_path):
    with pytest.raises(ServingError, match="layout nope"):
        sweep(["nope"], [LoadLevel("concurrency", 1)], tmp_path, [], url="a:1,a:2,a:3")
