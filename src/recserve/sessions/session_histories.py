"""The histories a batch of requests by session is answered from: each row's items appended to its session
first, then the session's newest items read back, in one transaction and one round trip for the whole
batch.

Where the store fails, a row that brought items is answered from those alone (and says so); a row that
brought none cannot be answered and gets the store's error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recserve.constants import HISTORY_FROM_REQUEST, HISTORY_FROM_STORE
from recserve.errors import StoreError
from recserve.sessions.session_store import Event, SessionStore
from recserve.sessions.store_contract import stored_ids


@dataclass
class SessionHistories:
    histories: list[np.ndarray]  # per row, oldest first, in the catalogue's ID type
    sources: np.ndarray  # (rows,) int32: HISTORY_FROM_STORE or HISTORY_FROM_REQUEST
    failed: list[StoreError | None]  # per row: the store's error where the row cannot be answered


def row_events(
    sessions: list[str], events: list[np.ndarray], event_ids: list[list[str | None] | None] | None = None
) -> list[Event]:
    """The events of a batch by session: each row's items (as a request holds them, checked by its parse) in
    order, with the client's event ID of each where it gave them."""
    ids = event_ids or [None] * len(sessions)
    return [
        Event(session, item.decode() if isinstance(item, bytes) else item, event_id=(given or [None] * len(row))[n])
        for session, row, given in zip(sessions, events, ids)
        for n, item in enumerate(row.tolist())
    ]


def session_histories(
    store: SessionStore,
    sessions: list[str],
    events: list[np.ndarray],
    window: int,
    string_ids: bool,
    event_ids: list[list[str | None] | None] | None = None,
) -> SessionHistories:
    """Appends ``events[i]`` to ``sessions[i]`` (in order; ``event_ids[i]``: the client's ID of each, where it
    gave them, so that a retried request stores them once), then reads each session's newest ``window`` items.
    An acknowledged append is always in the read that follows it."""
    rows = len(sessions)
    sources = np.full(rows, HISTORY_FROM_STORE, dtype=np.int32)
    try:
        appended = row_events(sessions, events, event_ids)
        # one round trip: the request's items (IDs of the catalogue's type: none is refused), then the reads
        _, stored = store.append_and_read(appended, sessions, window)
    except StoreError as err:
        histories = list(events)
        failed = [None if len(row) else err for row in events]
        return SessionHistories(histories, np.full(rows, HISTORY_FROM_REQUEST, dtype=np.int32), failed)
    # whatever a session holds, only its own row can come to harm: each is read by the store contract's rule,
    # which leaves out what breaks it (an item that is no int64, say) as an unknown ID would be
    return SessionHistories([stored_ids(members, string_ids) for members in stored], sources, [None] * rows)
