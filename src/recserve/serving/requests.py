"""Turns one request's raw tensors into a predictor call, with an error that names the bad field.

Shared by every server shell (the Triton python models and the SageMaker handler); numpy only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from recserve.constants import (
    DEFAULT_K,
    INPUT_EVENT_IDS,
    INPUT_EXCLUDE_ITEMS,
    INPUT_EXCLUDE_SEEN,
    INPUT_INCLUDE_ITEMS,
    INPUT_ITEM_IDS,
    INPUT_K,
    INPUT_RULE,
    INPUT_SESSION_ID,
    INPUT_WHERE,
    MAX_REQUEST_ITEMS,
    NATIVE_PAD_ID,
)
from recserve.errors import RequestError
from recserve.rules.rule_book import RequestRules, check_listed
from recserve.sessions import store_contract

P = TypeVar("P")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParsedRequest:
    histories: list[np.ndarray]  # one per row of the request
    k: int
    exclude_seen: np.ndarray | None  # (rows,) bool; None: the default, seen items excluded
    rules: RequestRules | None = None  # what the request keeps out of its answer (every row alike)

    def rows_rules(self) -> list[RequestRules | None]:
        return [self.rules] * len(self.histories)


def _column(values: np.ndarray, rows: int, name: str, kinds: str) -> np.ndarray:
    """A per-row scalar input, (rows, 1) or (rows,) or one value for all rows, as (rows,)."""
    values = np.asarray(values)
    if values.dtype.kind not in kinds:
        raise RequestError(f"{name}: wrong data type {values.dtype}")
    if values.size not in (1, rows):
        raise RequestError(f"{name}: expected one value per history ({rows}), got shape {list(values.shape)}")
    return np.broadcast_to(values.reshape(-1), (rows,))


def check_k(k: int, max_k: int) -> int:
    """``k`` as an int if it lies in 1..max_k (the one k check: Triton requests, SageMaker, the predictor)."""
    if not 1 <= k <= max_k:
        raise RequestError(f"{INPUT_K}: {k} is out of range; allowed 1..{max_k}")
    return int(k)


def parse_request(
    item_ids: np.ndarray, k: np.ndarray | None, exclude_seen: np.ndarray | None, max_k: int, string_ids: bool
) -> ParsedRequest:
    """Checks one request: ``item_ids`` (rows, L) or (L,), optional ``k`` and ``exclude_seen``.

    Raises:
        RequestError: a wrong data type or shape, or ``k`` outside 1..max_k.
    """
    item_ids = np.asarray(item_ids)
    if item_ids.ndim == 1:
        item_ids = item_ids[None, :]
    if item_ids.ndim != 2:
        raise RequestError(f"{INPUT_ITEM_IDS}: expected shape [batch, length], got {list(item_ids.shape)}")
    if item_ids.dtype.kind not in ("OSU" if string_ids else "iu"):
        expected = "BYTES (string IDs)" if string_ids else "INT64 (integer IDs)"
        raise RequestError(f"{INPUT_ITEM_IDS}: this model takes {expected}, got {item_ids.dtype}")
    rows = item_ids.shape[0]
    if item_ids.shape[1] > MAX_REQUEST_ITEMS:
        raise RequestError(
            f"{INPUT_ITEM_IDS}: {item_ids.shape[1]} items a row; at most {MAX_REQUEST_ITEMS} "
            "(the model reads the newest)"
        )
    if rows == 0:
        raise RequestError(f"{INPUT_ITEM_IDS}: the request holds no history (shape {list(item_ids.shape)})")
    k_value = DEFAULT_K
    if k is not None:
        ks = _column(k, rows, INPUT_K, "iu")
        if rows > 1 and np.any(ks != ks[0]):
            raise RequestError(f"{INPUT_K}: one k per request, got {sorted(set(ks.tolist()))}")
        k_value = int(ks[0])
    k_value = check_k(k_value, max_k)
    if exclude_seen is not None:
        exclude_seen = _column(exclude_seen, rows, INPUT_EXCLUDE_SEEN, "b").astype(bool)
    histories = [item_ids[0]] if rows == 1 else list(item_ids)
    return ParsedRequest(histories=histories, k=k_value, exclude_seen=exclude_seen)


@dataclass(frozen=True)
class SessionRequest:
    sessions: list[str]  # one per row of the request
    events: list[np.ndarray]  # per row the items to append first, in order (padding dropped; may be empty)
    k: int
    exclude_seen: np.ndarray | None
    rules: RequestRules | None = None  # what the request keeps out of its answer (every row alike)
    event_ids: list[list[str | None]] | None = None  # per row the client's ID of each item to append (None: none)

    def rows_rules(self) -> list[RequestRules | None]:
        return [self.rules] * len(self.sessions)

    def rows_event_ids(self) -> list[list[str | None] | None]:
        """Each row's event IDs (None for a row the client gave none)."""
        rows: list[list[str | None] | None] = [None] * len(self.sessions)
        return list(self.event_ids) if self.event_ids else rows


def parse_session_request(
    session_ids: np.ndarray,
    item_ids: np.ndarray | None,
    k: np.ndarray | None,
    exclude_seen: np.ndarray | None,
    max_k: int,
    string_ids: bool,
    event_ids: np.ndarray | None = None,
) -> SessionRequest:
    """Checks one request by session: ``session_ids`` (rows, 1) or (rows,) BYTES, and optionally the items
    to append to each row's session first, ``item_ids`` (rows, L), padded on the right with -1 (integer
    IDs) or empty strings; ``k`` and ``exclude_seen`` as ``parse_request`` takes them.

    Raises:
        RequestError: a wrong data type or shape, an empty or undecodable session ID, ``k`` out of range.
    """
    session_ids = np.asarray(session_ids)
    if session_ids.dtype.kind not in "OSU":
        raise RequestError(f"{INPUT_SESSION_ID}: BYTES (one session ID a row), got {session_ids.dtype}")
    if session_ids.ndim == 2 and session_ids.shape[1] == 1:
        session_ids = session_ids[:, 0]
    if session_ids.ndim != 1 or session_ids.size == 0:
        raise RequestError(f"{INPUT_SESSION_ID}: expected shape [batch, 1], got {list(session_ids.shape)}")
    try:
        sessions = [s.decode() if isinstance(s, bytes) else str(s) for s in session_ids.tolist()]
    except UnicodeDecodeError as err:
        raise RequestError(f"{INPUT_SESSION_ID}: not UTF-8 ({err.reason})") from None
    for session in sessions:
        if problem := store_contract.session_problem(session):
            raise RequestError(f"{INPUT_SESSION_ID}: {problem.removeprefix('session: ')}")
    rows = len(sessions)
    if item_ids is None:
        if event_ids is not None:
            raise RequestError(f"{INPUT_EVENT_IDS}: event IDs name items to append; send them with {INPUT_ITEM_IDS}")
        parsed = parse_request(
            np.full((rows, 1), b"" if string_ids else NATIVE_PAD_ID), k, exclude_seen, max_k, string_ids
        )
        events = [parsed.histories[0][:0]] * rows
    else:
        parsed = parse_request(item_ids, k, exclude_seen, max_k, string_ids)
        if len(parsed.histories) != rows:
            raise RequestError(f"{INPUT_ITEM_IDS}: {len(parsed.histories)} rows for {rows} sessions")
        padding = (b"", "") if string_ids else (NATIVE_PAD_ID,)
        kept = [~np.isin(h, padding) for h in parsed.histories]
        events = [h[keep] for h, keep in zip(parsed.histories, kept)]
        _check_events(events, string_ids)
        if event_ids is not None:
            return replace(
                SessionRequest(sessions, events, parsed.k, parsed.exclude_seen),
                event_ids=_event_ids(event_ids, parsed.histories, kept),
            )
    return SessionRequest(sessions, events, parsed.k, parsed.exclude_seen)


def _event_ids(values: np.ndarray, histories: list[np.ndarray], kept: list[np.ndarray]) -> list[list[str | None]]:
    """Each row's event IDs for the items it appends (as ``item_ids`` holds them, padding dropped alike; "" for
    an item the client gave no ID).

    Raises:
        RequestError: not BYTES of ``item_ids``' shape, not UTF-8, or an ID that breaks the store's rule.
    """
    values = np.asarray(values)
    shape = [len(histories), len(histories[0])]
    if values.dtype.kind not in "OSU" or list(values.reshape(len(histories), -1).shape) != shape:
        raise RequestError(f"{INPUT_EVENT_IDS}: BYTES of {INPUT_ITEM_IDS}' shape {shape}, got {list(values.shape)}")
    out: list[list[str | None]] = []
    for row, keep in zip(values.reshape(len(histories), -1), kept):
        ids: list[str | None] = []
        for value in row[keep].tolist():
            try:
                text = value.decode() if isinstance(value, bytes) else str(value)
            except UnicodeDecodeError as err:
                raise RequestError(f"{INPUT_EVENT_IDS}: not UTF-8 ({err.reason})") from None
            if text and (problem := store_contract.event_id_problem(text)):
                raise RequestError(f"{INPUT_EVENT_IDS}: {problem.removeprefix('event_id: ')}")
            ids.append(text or None)
        out.append(ids)
    return out


def _check_events(events: list[np.ndarray], string_ids: bool) -> None:
    """Each item to append holds to the store's rule for the catalogue's type (``store_contract``)."""
    id_type = "string" if string_ids else "int64"
    for row in events:
        for item in row.tolist():
            try:
                value = item.decode() if isinstance(item, bytes) else item
            except UnicodeDecodeError as err:
                raise RequestError(f"{INPUT_ITEM_IDS}: an item ID that is not UTF-8 ({err.reason})") from None
            if problem := store_contract.item_problem(value, id_type):
                raise RequestError(f"{INPUT_ITEM_IDS}: {problem.removeprefix('item: ')}")


def exclude_flags(parsed: list[ParsedRequest]) -> np.ndarray | bool:
    """The batch's ``exclude_seen``, one flag per row, or True when no request set it."""
    if all(p.exclude_seen is None for p in parsed):
        return True
    rows = [np.ones(len(p.histories), dtype=bool) if p.exclude_seen is None else p.exclude_seen for p in parsed]
    return np.concatenate(rows)


def parse_rules(value: Callable[[str], np.ndarray | None], string_ids: bool) -> RequestRules | None:
    """A request's business rules from its optional inputs (``value(name)``: the tensor, or None where the
    request has not that input): a stored rule's name, a rule written out, items to exclude, items to keep to.

    Raises:
        RequestError: a name or rule that is not one UTF-8 string, a list of IDs of the wrong type or too long.
    """
    rule, where = _text(value(INPUT_RULE), INPUT_RULE), _text(value(INPUT_WHERE), INPUT_WHERE)
    exclude = _ids(value(INPUT_EXCLUDE_ITEMS), INPUT_EXCLUDE_ITEMS, string_ids)
    include = _ids(value(INPUT_INCLUDE_ITEMS), INPUT_INCLUDE_ITEMS, string_ids)
    if rule is None and where is None and exclude is None and include is None:
        return None
    return RequestRules(rule, where, exclude, include)


def _text(values: np.ndarray | None, name: str) -> str | None:
    if values is None:
        return None
    values = np.asarray(values)
    if values.dtype.kind not in "OSU" or values.size != 1:
        raise RequestError(f"{name}: one string (BYTES [1]), got {values.dtype} of shape {list(values.shape)}")
    value = values.reshape(-1)[0]
    try:
        text = value.decode() if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError as err:
        raise RequestError(f"{name}: not UTF-8 ({err.reason})") from None
    return text or None


def _ids(values: np.ndarray | None, name: str, string_ids: bool) -> np.ndarray | None:
    flat = check_listed(name, values)
    if flat is None:
        return None
    if flat.dtype.kind not in ("OSU" if string_ids else "iu"):
        expected = "BYTES (string IDs)" if string_ids else "INT64 (integer IDs)"
        raise RequestError(f"{name}: this model takes {expected}, got {flat.dtype}")
    return flat


def parse_triton_request(request, max_k: int, string_ids: bool) -> ParsedRequest:
    """``parse_request`` for a Triton python-backend request: its input tensors are read in one pass."""
    inputs = {tensor.name(): tensor for tensor in request.inputs()}
    if INPUT_ITEM_IDS not in inputs:
        raise RequestError(f"missing input '{INPUT_ITEM_IDS}'")
    value = lambda name: inputs[name].as_numpy() if name in inputs else None  # noqa: E731
    parsed = parse_request(
        inputs[INPUT_ITEM_IDS].as_numpy(), value(INPUT_K), value(INPUT_EXCLUDE_SEEN), max_k, string_ids
    )
    return replace(parsed, rules=parse_rules(value, string_ids))


def parse_each(requests: Sequence[Any], parse: Callable[[Any], P]) -> tuple[list[P | RequestError], list[P]]:
    """A batch's requests parsed one by one: each one's parse, or its ``RequestError`` in its place (a bad
    request is answered alone, never fails the batch), and the good ones."""
    parsed: list[P | RequestError] = []
    for request in requests:
        try:
            parsed.append(parse(request))
        except RequestError as err:
            parsed.append(err)
        except Exception as err:  # a defect met by one request's input is that request's alone
            log.exception("a request could not be read")
            parsed.append(
                RequestError(f"the request could not be read ({type(err).__name__}); the server's log says why")
            )
    return parsed, [p for p in parsed if not isinstance(p, RequestError)]
