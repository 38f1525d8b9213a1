"""The business rules a load test asks under (``recserve bench --rules``): each variant's request inputs, the
items it hides for its runs, and what it costs beside no rule.

Variants: ``none``; ``rule:NAME`` (a rule the repository stores by name); ``exclude:N`` and ``include:N`` (N
item IDs of the catalogue a request, different in every request); ``hidden:PCT`` (PCT percent of the
catalogue hidden through the store for the variant's runs, shown again after).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recserve.bench.load_report import row_level, succeeded
from recserve.constants import INPUT_EXCLUDE_ITEMS, INPUT_INCLUDE_ITEMS, INPUT_RULE, MAX_RULE_ITEMS
from recserve.errors import ServingError

NONE = "none"
KINDS = ("none", "rule", "exclude", "include", "hidden")
HIDE_PROBES = 50  # answers checked after each run under a hide (none may show a hidden item)


@dataclass(frozen=True)
class RuleVariant:
    name: str  # as given: none, rule:NAME, exclude:N, include:N, hidden:PCT
    kind: str
    value: str = ""

    @property
    def count(self) -> int:
        return int(self.value)

    def inputs(self, n: int, catalogue: np.ndarray, string_ids: bool) -> dict:
        """Request ``n``'s rule inputs as perf_analyzer's JSON rows hold them (none for ``none`` and ``hidden``)."""
        if self.kind == "rule":
            return {INPUT_RULE: {"content": [self.value], "shape": [1]}}
        if self.kind in ("exclude", "include"):
            rng = np.random.default_rng(n)
            ids = catalogue[rng.choice(len(catalogue), size=min(self.count, len(catalogue)), replace=False)]
            values = [str(x) for x in ids] if string_ids else [int(x) for x in ids]
            name = INPUT_EXCLUDE_ITEMS if self.kind == "exclude" else INPUT_INCLUDE_ITEMS
            return {name: {"content": values, "shape": [len(values)]}}
        return {}


def parse_variants(text: str | None) -> list[RuleVariant]:
    """``none,rule:in_stock,exclude:100,hidden:10`` as variants (``none`` first, added where not given).

    Raises:
        ServingError: a variant that is not one of the forms, naming them.
    """
    forms = "none, rule:NAME, exclude:N, include:N (N 1..1024) or hidden:PCT (0 < PCT < 100)"
    variants = [RuleVariant(NONE, NONE)]
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        kind, _, value = part.partition(":")
        if part == NONE:
            continue
        ok = kind in KINDS[1:] and bool(value)
        if ok and kind in ("exclude", "include"):
            ok = value.isdigit() and 1 <= int(value) <= MAX_RULE_ITEMS
        if ok and kind == "hidden":
            ok = value.replace(".", "", 1).isdigit() and 0 < float(value) < 100
        if not ok:
            raise ServingError(f"--rules {part!r}: expected {forms}")
        variants.append(RuleVariant(part, kind, value))
    return variants


def repository_catalogue(repo: Path) -> np.ndarray:
    """The item IDs of a repository's catalogue: a python model's export copy, else a native model's rule bank.

    Raises:
        ServingError: a repository that holds neither.
    """
    from recserve.artifacts.catalogue import read_catalogue
    from recserve.constants import ITEM_TABLE_FILE, RULE_BANK_FILE

    for table in sorted(Path(repo).glob(f"*/*/export/{ITEM_TABLE_FILE}")):
        return read_catalogue(table.parent)
    from recserve.artifacts.rule_bank import load_rule_bank

    for bank in sorted(Path(repo).glob(f"*/*/{RULE_BANK_FILE}")):
        return load_rule_bank(bank)[0]
    raise ServingError(f"{repo}: no model of it holds its catalogue (a python model's export, or a rule bank)")


@contextlib.contextmanager
def hidden_for(variant: RuleVariant, store_record: dict | None, catalogue: np.ndarray) -> Iterator[set[str]]:
    """Hides ``variant``'s share of the catalogue (a fixed random choice) for the length of the block; yields
    the items it hid, as text (none for the other kinds).

    Raises:
        ServingError: a ``hidden`` variant without a store.
    """
    if variant.kind != "hidden":
        yield set()
        return
    if store_record is None:
        raise ServingError(f"--rules {variant.name}: hides items through the repository's store; it has none")
    from recserve.sessions import embedded_store
    from recserve.sessions.session_store import SessionStore

    folder = embedded_store.folder_of(store_record)
    if folder is None:
        raise ServingError(
            f"--rules {variant.name}: hides items as the store's catalogue operator, whose password only recserve's "
            "own store keeps beside its record; run this variant with recserve's embedded store"
        )
    count = max(1, round(len(catalogue) * float(variant.value) / 100))
    chosen = [str(x) for x in np.random.default_rng(0).choice(catalogue, size=count, replace=False)]
    with SessionStore(embedded_store.role_settings(folder, "operator")) as store:
        store.hide(chosen)
        try:
            yield set(chosen)
        finally:
            store.hide(chosen, hidden=False)


def rule_overhead(rows: list[dict], slo_p99_ms: float) -> dict:
    """Each layout's rule variants beside its runs without a rule: p50 in milliseconds more and throughput as a
    ratio at each shared level, and the best throughput within the SLO over no rule's.

    A level run more than once (``--concurrency 1,1,1``: each round every variant in turn) compares each round's
    run with no rule's of the same round, and gives the median over the rounds, with ``rounds``: on a host whose
    p50 moves by a tenth of a millisecond from one run to the next, one pair of runs cannot tell such a cost.
    """
    ok = [r for r in rows if succeeded(r)]
    by: dict[tuple, dict[int, dict]] = {}  # (layout, rules, level): its runs that succeeded, by round
    for r in rows:  # a failed run keeps its round, so that the rounds after it pair as they ran
        runs = by.setdefault((r["layout"], r.get("rules", NONE), row_level(r)), {})
        runs[len(runs)] = r
    for runs in by.values():
        for round_, r in list(runs.items()):
            if not succeeded(r):
                del runs[round_]

    def best(layout: str, rules: str) -> float | None:
        mine = [r for r in ok if (r["layout"], r.get("rules", NONE)) == (layout, rules)]
        return max((r["throughput_rps"] for r in mine if r["p99_ms"] <= slo_p99_ms), default=None)

    out: dict = {}
    for layout, rules in sorted({(r["layout"], r.get("rules", NONE)) for r in ok}):
        if rules == NONE:
            continue
        levels = {}
        for (other_layout, other_rules, level), runs in by.items():
            bases = by.get((layout, NONE, level), {})
            pairs = [(r, bases[round_]) for round_, r in runs.items() if round_ in bases]  # round by round
            if (other_layout, other_rules) == (layout, rules) and pairs:
                levels[f"{level[0]}={level[1]:g}"] = {
                    "p50_ms_more": float(np.median([r["p50_ms"] - b["p50_ms"] for r, b in pairs])),
                    "throughput": float(np.median([r["throughput_rps"] / b["throughput_rps"] for r, b in pairs])),
                    **({"rounds": len(pairs)} if len(pairs) > 1 else {}),
                }
        mine, theirs = best(layout, rules), best(layout, NONE)
        probed = [r for r in ok if (r["layout"], r.get("rules")) == (layout, rules) and "answers_probed" in r]
        out.setdefault(layout, {})[rules] = {
            "levels": levels,
            "best_within_slo_over_none": None if not mine or not theirs else mine / theirs,
            **(
                {
                    "answers_showing_hidden": sum(r["answers_showing_hidden"] for r in probed),
                    "answers_probed": sum(r["answers_probed"] for r in probed),
                }
                if probed
                else {}
            ),
        }
    return out
