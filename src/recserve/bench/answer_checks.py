"""What a sweep checks of a server's answers beside its load: one full answer a layout before it (a broken stub
environment answers nothing, which perf_analyzer alone would not notice), the native layout's answers against
the fused one's, and, after a run under a hide, that no answer shows a hidden item."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np

from recserve.artifacts.served import LAYOUTS
from recserve.bench import perf_analyzer as pa
from recserve.constants import SEED_HISTORY_LENGTH
from recserve.errors import ServingError

TOP = 10  # what check_answers and compare_native ask for


def check_answers(layout: str, http_url: str, grpc_url: str, history: np.ndarray, string_ids: bool) -> None:
    """One real request per layout: outputs must be full.

    An empty answer means a broken stub environment (numpy 2), which perf_analyzer alone would not notice.
    """
    served = LAYOUTS[layout]
    if served.request in ("items", "native"):
        with client_of(grpc_url, layout) as client:
            ids = client.recommend(history, k=TOP).item_ids.tolist()
    elif served.by_session:
        with client_of(grpc_url, layout) as client:
            answer = client.recommend_session(pa.BENCH_SESSION.format(0), k=TOP, model=served.entry)
            if answer.history_length == 0:
                raise ServingError(f"layout {layout}: the store holds no history of the bench's first session")
            ids = answer.item_ids.tolist()
    else:  # the seed ensemble: exactly SEED_HISTORY_LENGTH IDs, no batch dimension
        ids = _seed_answer(layout, http_url, history, string_ids)
    if len(ids) != TOP:
        raise ServingError(f"layout {layout}: the server answered {ids!r} instead of {TOP} items; see the server log")


def _seed_answer(layout: str, http_url: str, history: np.ndarray, string_ids: bool) -> list:
    served = LAYOUTS[layout]
    values = [str(x) if string_ids else int(x) for x in history[-SEED_HISTORY_LENGTH:]]
    data = {"name": served.ids_input, "shape": [len(values)], "datatype": "BYTES" if string_ids else "INT64"}
    request = urllib.request.Request(
        f"http://{http_url}/v2/models/{served.entry}/infer",
        data=json.dumps({"inputs": [data | {"data": values}]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            outputs = {o["name"]: o for o in json.load(reply)["outputs"]}
    except urllib.error.HTTPError as err:
        raise ServingError(f"layout {layout}: HTTP {err.code}: {err.read().decode(errors='replace')}") from err
    return outputs.get(served.ids_output, {}).get("data", [])


def client_of(grpc_url: str, layout: str):
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
    with client_of(grpc_url, layout) as client:
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
    with client_of(grpc_url, "fused") as fused, client_of(grpc_url, "native") as native:
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
