"""The step summaries recserve's backend logs (``recserve repo --step-summary-s N``), read back.

Each instance logs, every N seconds, how many batches it ran, how many of them under rules, and each step's
median, 99th percentile and largest milliseconds a batch (reading the requests, the store's round trips, the
inputs' copies, the graph, the answers). ``steps_beside_none`` compares the steps of the periods that ran no
ruled batch with those that ran only ruled ones: where a sweep runs one load level (``--concurrency 1,1,1``),
that is what a rule adds to each step of a batch, free of the host's noise between the client and the server
that a client's p50 carries.
"""

from __future__ import annotations

import re
from pathlib import Path
from statistics import median

_LINE = re.compile(
    r"recserve backend: (?P<instance>\S+): batches (?P<batches>\d+) in (?P<seconds>[\d.]+) s, "
    r"under rules (?P<ruled>\d+); ms a batch, p50/p99/max: (?P<steps>[^\"]*)"
)


def read_step_lines(text: str) -> list[dict]:
    """Every step summary in a server's log: instance, batches, ruled (batches under rules), and steps
    ({step: (p50, p99, max)} in milliseconds). Other lines are passed over."""
    out = []
    for match in _LINE.finditer(text):
        steps = {}
        for part in match["steps"].strip().split(", "):
            name, times = part.split(" ")
            p50, p99, top = (float(t) for t in times.split("/"))
            steps[name] = (p50, p99, top)
        out.append(
            {
                "instance": match["instance"],
                "batches": int(match["batches"]),
                "ruled": int(match["ruled"]),
                "steps": steps,
            }
        )
    return out


def steps_beside_none(lines: list[dict], min_batches: int = 100) -> dict:
    """Each step's median p50 over the periods with no ruled batch (``none``) and over those with only ruled
    ones (``ruled``), and ``more_ms`` (ruled less none) for each step and in all; periods of fewer than
    ``min_batches`` (the first batch's, a period cut by the end of the load) or of both kinds are left out.

    Raises:
        ValueError: no period of one of the two kinds.
    """
    kinds: dict[str, dict[str, list[float]]] = {"none": {}, "ruled": {}}
    for line in lines:
        if line["batches"] < min_batches or 0 < line["ruled"] < line["batches"]:
            continue
        kind = kinds["none" if line["ruled"] == 0 else "ruled"]
        for step, (p50, _, _) in line["steps"].items():
            kind.setdefault(step, []).append(p50)
    missing = [name for name, steps in kinds.items() if not steps]
    if missing:
        raise ValueError(f"no period of {min_batches} batches or more ran {' or '.join(missing)} alone")
    out: dict = {
        name: {step: median(p50s) for step, p50s in steps.items()} | {"periods": len(next(iter(steps.values())))}
        for name, steps in kinds.items()
    }
    shared = [step for step in kinds["none"] if step in kinds["ruled"]]
    out["more_ms"] = {step: out["ruled"][step] - out["none"][step] for step in shared}
    out["more_ms"]["all"] = sum(out["more_ms"].values())
    return out


def keep_step_summary(server_log: str, folder: Path, rules: bool) -> dict | None:
    """A sweep's server log's step lines kept in ``folder``/step-summary.log; under rules, each step's median
    with no rule and under rules (``steps_beside_none``; an error where the periods were too long for the
    variants' runs); None without rules."""
    lines = [x for x in server_log.splitlines() if "p50/p99/max" in x]
    (folder / "step-summary.log").write_text("\n".join(lines) + "\n")
    if not rules:
        return None
    try:
        return steps_beside_none(read_step_lines(server_log))
    except ValueError as err:  # periods too long for the variants' runs: see --step-summary-s
        return {"error": str(err)}
