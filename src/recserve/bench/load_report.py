"""The benchmark's markdown report and the ratios that matter."""

from __future__ import annotations

from pathlib import Path

# the ratios reported: each layout against the one it stands in for (by session against by items)
PAIRS = (
    ("fused", "seed"),
    ("fused", "echo"),
    ("native", "fused"),
    ("native", "echo"),
    ("native", "floor"),
    ("session", "fused"),
    ("native_session", "native"),
)


def row_label(row: dict) -> str:
    """A row's name in reports and plots: its variant (GPU runs) or layout, the protocol where a sweep ran
    more than one, and the rules it ran under."""
    name = row.get("variant", row["layout"]) + (f" over {row['protocol']}" if row.get("protocol") else "")
    return f"{name} [{row['rules']}]" if row.get("rules") else name


def row_level(row: dict) -> tuple[str, float]:
    return ("concurrency", row["concurrency"]) if "concurrency" in row else ("request_rate", row["request_rate"])


def succeeded(row: dict) -> bool:
    """Whether a run measured its load: no error, a throughput."""
    return not row.get("errors") and "throughput_rps" in row


def versus(row: dict, other: dict) -> dict:
    """One run against another at the same level: throughput and p99 as ratios, p50 as milliseconds more."""
    return {
        "throughput": row["throughput_rps"] / other["throughput_rps"],
        "p99": row["p99_ms"] / other["p99_ms"],
        "p50_ms_more": row["p50_ms"] - other["p50_ms"],
    }


def ratios(rows: list[dict], slo_p99_ms: float) -> dict:
    """Each of PAIRS (fused over seed, native over fused, by session over by items, ...) at each shared load
    level (throughput and p99 as ratios, p50 as milliseconds more); the best throughput within the SLO per
    layout, and best over best."""
    ok = [r for r in rows if succeeded(r)]
    by = {(r["layout"], row_level(r)): r for r in ok}
    out: dict = {f"{a}_over_{b}": {} for a, b in PAIRS} | {"best_within_slo": {}}
    for (layout, level), row in by.items():
        key = f"{level[0]}={level[1]:g}"
        for a, other in PAIRS:
            if layout == a and (other, level) in by:
                out[f"{a}_over_{other}"][key] = versus(row, by[(other, level)])
    for layout in {r["layout"] for r in ok}:
        within = [r for r in ok if r["layout"] == layout and r["p99_ms"] <= slo_p99_ms]
        best = max(within, key=lambda r: r["throughput_rps"], default=None)
        out["best_within_slo"][layout] = (
            None
            if best is None
            else {
                "throughput_rps": best["throughput_rps"],
                "p99_ms": best["p99_ms"],
                "level": "=".join(map(str, row_level(best))),
            }
        )
    best = {
        layout: max(r["throughput_rps"] for r in ok if r["layout"] == layout) for layout in {r["layout"] for r in ok}
    }
    for a, b in PAIRS:
        if a in best and b in best:
            out[f"best_{a}_over_best_{b}"] = best[a] / best[b]
    return out


def protocol_ratios(rows: list[dict]) -> dict:
    """Where a sweep ran both protocols: each layout's HTTP run over its gRPC run at each level (rules aside),
    as ``versus`` gives it."""
    ok = [r for r in rows if r.get("protocol") and "rules" not in r and succeeded(r)]
    by = {(r["layout"], row_level(r), r["protocol"]): r for r in ok}
    out: dict = {}
    for (layout, level, protocol), row in by.items():
        grpc = by.get((layout, level, "grpc"))
        if protocol == "http" and grpc is not None:
            out.setdefault(layout, {})[f"{level[0]}={level[1]:g}"] = versus(row, grpc)
    return out


def write_report(summary: dict, path: Path) -> None:
    """report.md: the settings, a row a run, the ratios, then the rules', the traces' and the CPU's sections
    where the sweep measured them."""
    lines = _results(summary) + _ratios(summary) + _rules(summary) + _traces(summary) + _cpu(summary)
    path.write_text("\n".join(lines) + "\n")


def _host(summary: dict) -> list[str]:
    """The host's line (the server's path follows its CPU), where the summary records it."""
    host = summary.get("host")
    return [f"Host: {host['cpu']}, {host['cores']} cores."] if host else []


def _results(summary: dict) -> list[str]:
    s = summary["settings"]
    lines = [
        "# Benchmark",
        "",
        f"perf_analyzer over {s['protocol']}, {s['measurement_ms']} ms windows, "
        + (f"{s['client_threads']} client threads, " if s.get("client_threads") else "")
        + f"requests from {s['requests_from']}; p99 SLO {s['slo_p99_ms']} ms."
        + (f" By session, one request in {s['events_every']} carries an event." if s.get("events_every") else ""),
        *_host(summary),
        "",
        "| layout | load | throughput (req/s) | p50 ms | p90 ms | p99 ms | errors | server steps (ms per request) |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in summary["results"]:
        kind, value = row_level(r)
        steps = "; ".join(
            f"{name}: queue {v['queue_ms']:.2f}, infer {v['compute_infer_ms']:.2f}"
            + (f", batch {v['avg_batch']:.1f}" if v.get("avg_batch") else "")
            for name, v in r.get("steps", {}).items()
        )
        if "throughput_rps" not in r:
            lines.append(
                f"| {row_label(r)} | {kind} {value:g} | failed: {r.get('error', '')} | | | | {r['errors']} | |"
            )
            continue
        lines.append(
            f"| {row_label(r)} | {kind} {value:g} | {r['throughput_rps']:,.0f} | {r['p50_ms']:.2f} | "
            f"{r['p90_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors']} | {steps} |"
        )
    if summary.get("stopped"):
        lines += ["", f"The sweep stopped early: {summary['stopped']}."]
    return lines


def _ratios(summary: dict) -> list[str]:
    lines = ["", "## Ratios", ""]
    ratios_ = summary["ratios"]
    for a, b in PAIRS:
        for level, v in ratios_.get(f"{a}_over_{b}", {}).items():
            lines.append(
                f"- {a} over {b} at {level}: throughput x{v['throughput']:.2f}, p99 x{v['p99']:.2f}, "
                f"p50 {v['p50_ms_more']:+.2f} ms"
            )
    for layout, levels in summary.get("http_over_grpc", {}).items():
        for level, v in levels.items():
            lines.append(
                f"- {layout} over HTTP against gRPC at {level}: throughput x{v['throughput']:.2f}, "
                f"p50 {v['p50_ms_more']:+.2f} ms"
            )
    for a, b in PAIRS:
        if f"best_{a}_over_best_{b}" in ratios_:
            lines.append(f"- best {a} over best {b} throughput: x{ratios_[f'best_{a}_over_best_{b}']:.2f}")
    if "native_vs_fused" in summary:
        v = summary["native_vs_fused"]
        lines.append(
            f"- native against fused, {v['histories']} real histories: the same top 10 (ties within "
            f"{v['tolerance']:g} aside) for {v['same_top10_ties_aside']:.1%}, top-10 overlap "
            f"{v['top10_overlap']:.3f}, largest score difference {v['max_score_diff']:.2e}"
        )
    for layout, best in ratios_["best_within_slo"].items():
        lines.append(
            f"- {layout}: best throughput within the SLO: "
            + (
                "none"
                if best is None
                else f"{best['throughput_rps']:,.0f} req/s at {best['level']} (p99 {best['p99_ms']:.2f} ms)"
            )
        )
    return lines


def _rules(summary: dict) -> list[str]:
    lines: list[str] = []
    if summary.get("rule_overhead"):
        lines += ["", "## Business rules beside none", ""]
        for layout, variants in summary["rule_overhead"].items():
            for rules, v in variants.items():
                levels = ", ".join(
                    f"{level} p50 {x['p50_ms_more']:+.2f} ms, throughput x{x['throughput']:.2f}"
                    + (f" (median of {x['rounds']} rounds)" if x.get("rounds") else "")
                    for level, x in v["levels"].items()
                )
                best = v["best_within_slo_over_none"]
                lines.append(
                    f"- {layout} [{rules}]: {levels}; best within the SLO x{best:.2f} of none's"
                    if best is not None
                    else f"- {layout} [{rules}]: {levels}; no level within the SLO"
                )
                if "answers_probed" in v:  # the hide held: answers after each run's load, checked
                    shown, probed = v["answers_showing_hidden"], v["answers_probed"]
                    lines[-1] += f"; {shown} of {probed} answers after it showed a hidden item"
    return lines


def _traces(summary: dict) -> list[str]:
    lines: list[str] = []
    traced = [r for r in summary["results"] if r.get("trace", {}).get("traces")]
    if traced:
        stages = list(traced[0]["trace"]["p50_ms"])
        lines += [
            "",
            "## Where the traced requests spent their time",
            "",
            "Triton's own traces of one request in N (`--trace-rate`): milliseconds in the server, from the "
            "frontend having read a request to its answer sent, by stage; p50 and p99 of each stage, and the "
            "mean of each stage over the slowest hundredth of the traced requests (where the tail is spent).",
            "",
            "| layout | load | traces | "
            + " | ".join(f"{s} p50/p99" for s in stages)
            + " | slowest 1%: "
            + ", ".join(stages)
            + " |",
            "|---|---|---:|" + "---:|" * len(stages) + "---|",
        ]
        for r in traced:
            kind, value = row_level(r)
            t = r["trace"]
            cells = " | ".join(f"{t['p50_ms'][s]:.2f}/{t['p99_ms'][s]:.2f}" for s in stages)
            tail = ", ".join(f"{t['slowest']['mean_ms'][s]:.2f}" for s in stages)
            lines.append(f"| {row_label(r)} | {kind} {value:g} | {t['traces']} | {cells} | {tail} |")
    return lines


def _cpu(summary: dict) -> list[str]:
    lines: list[str] = []
    measured = [r for r in summary["results"] if r.get("cpu_us_per_request")]
    if measured:
        lines += [
            "",
            "## CPU per request",
            "",
            "Microseconds of CPU time a request in each process group while the load ran: perf_analyzer "
            "(client), Triton's server process, and its model processes.",
            "",
        ]
        for r in measured:
            kind, value = row_level(r)
            cpu = r["cpu_us_per_request"]
            lines.append(
                f"- {row_label(r)} at {kind} {value:g}: client {cpu['client']:.0f}, "
                f"server {cpu['server']:.0f}, models {cpu['models']:.0f}"
            )
    return lines
