"""The session store: events appended to one capped list per session, the latest items read back.

Each session is a Redis list under ``StoreSettings.key``: appended with RPUSH, trimmed to the newest
``window`` items with LTRIM and given its time-to-live with EXPIRE, the three in one MULTI/EXEC, so a
call's events of a session land together and in order, and an event is acknowledged only once the store
has applied it. Reads are one pipelined LRANGE per session. Every call is bounded by ``timeout_s`` (one
retry at most); an unreachable, slow or refusing store is a ``StoreError``, never a hang.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from recserve.errors import StoreError
from recserve.sessions.store_settings import MAX_ITEM_ID, MAX_SESSION_ID, StoreSettings

KINDS = ("view", "cart", "purchase")  # what an event may say it was; the model reads the items of all kinds


@dataclass(frozen=True)
class Event:
    """One shopper's action: ``item`` seen in ``session`` at ``time`` (seconds; None: now, in arrival order)."""

    session: str
    item: str | int
    time: float | None = None
    kind: str | None = None


@dataclass
class AppendResult:
    """What a call to ``append`` did: how many events the store acknowledged, and each refused one by its
    position in the call with the reason."""

    accepted: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)


def event_problem(event: Event) -> str | None:
    """Why ``event`` cannot be stored, or None."""
    session, item = event.session, event.item
    if not isinstance(session, str) or not session or len(session) > MAX_SESSION_ID:
        return f"session: a non-empty string of at most {MAX_SESSION_ID} characters, got {session!r:.80}"
    if isinstance(item, bool) or not isinstance(item, (str, int)):
        return f"item: an item ID (a string or an integer), got {type(item).__name__}"
    if isinstance(item, str) and (not item or len(item) > MAX_ITEM_ID):
        return f"item: a non-empty ID of at most {MAX_ITEM_ID} characters"
    if event.time is not None and (
        isinstance(event.time, bool) or not isinstance(event.time, (int, float)) or not math.isfinite(event.time)
    ):
        return f"time: seconds as a finite number, got {event.time!r:.40}"
    if event.kind is not None and event.kind not in KINDS:
        return f"kind: one of {', '.join(KINDS)}, got {event.kind!r:.40}"
    return None


class SessionStore:
    """A Redis-protocol store of sessions (Valkey or Redis), as ``settings`` says."""

    def __init__(self, settings: StoreSettings):
        self.settings = settings
        self._client = redis.Redis.from_url(
            settings.url,
            username=settings.username,
            password=settings.secret(),
            socket_timeout=settings.timeout_s,
            socket_connect_timeout=settings.timeout_s,
            retry=Retry(NoBackoff(), 1),
            decode_responses=True,
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, what: str, fn):
        try:
            return fn()
        except redis.AuthenticationError as err:
            raise StoreError(f"the session store at {self.settings.url} refused recserve's credentials") from err
        except redis.TimeoutError as err:
            raise StoreError(
                f"the session store at {self.settings.url} did not answer {what} within {self.settings.timeout_s} s"
            ) from err
        except redis.ConnectionError as err:
            raise StoreError(f"the session store at {self.settings.url} cannot be reached ({what}): {err}") from err
        except redis.ResponseError as err:
            if isinstance(err, redis.exceptions.NoPermissionError) or "no permissions" in str(err):
                raise StoreError(
                    f"the session store at {self.settings.url} refused {what} (no permission): {err}"
                ) from err
            if str(err).startswith(("NOAUTH", "WRONGPASS", "NOPERM")):
                raise StoreError(f"the session store at {self.settings.url} refused {what}: {err}") from err
            raise StoreError(f"the session store at {self.settings.url} failed {what}: {err}") from err

    def ping(self) -> None:
        """Raises ``StoreError`` unless the store answers."""
        self._call("a ping", self._client.ping)

    def append(self, events: Iterable[Event]) -> AppendResult:
        """Appends the good events (each session's in time order, events without a time after those with
        one, ties in call order) and reports the bad ones; the good ones are stored whatever the bad.

        Raises:
            StoreError: the store did not acknowledge them (none of this call's events is then counted).
        """
        pipe = self._client.pipeline(transaction=True)
        result = self._queue_append(pipe, events)
        if result.accepted:
            self._call("the append", pipe.execute)
        return result

    def append_and_read(
        self, events: Iterable[Event], sessions: Sequence[str], count: int | None = None
    ) -> tuple[AppendResult, list[list[str]]]:
        """``append(events)``, then ``recent(sessions, count)``, in one transaction and one round trip: the
        read holds the append.

        Raises:
            StoreError: the store did not answer (nothing of this call is then counted as acknowledged).
        """
        count = self._read_count(sessions, count)
        pipe = self._client.pipeline(transaction=True)
        result = self._queue_append(pipe, events)
        if not result.accepted:
            return result, self.recent(sessions, count)
        for session in sessions:
            pipe.lrange(self.settings.key(session), -count, -1)
        replies = self._call("the append and read", pipe.execute)
        return result, replies[len(replies) - len(sessions) :]

    def _queue_append(self, pipe, events: Iterable[Event]) -> AppendResult:
        """Queues the good events on ``pipe`` (each session's in time order) and reports the bad ones;
        ``accepted`` counts what the pipe will append once executed."""
        result = AppendResult()
        by_session: dict[str, list[tuple[float, int, str]]] = {}
        for position, event in enumerate(events):
            problem = event_problem(event)
            if problem:
                result.errors.append((position, problem))
                continue
            when = math.inf if event.time is None else float(event.time)
            by_session.setdefault(event.session, []).append((when, position, str(event.item)))
        for session, rows in by_session.items():
            key = self.settings.key(session)
            pipe.rpush(key, *(item for _, _, item in sorted(rows)))
            pipe.ltrim(key, -self.settings.window, -1)
            if self.settings.ttl_s:
                pipe.expire(key, self.settings.ttl_s)
        result.accepted = sum(len(rows) for rows in by_session.values())
        return result

    def append_histories(
        self,
        sessions: Sequence[str],
        histories: Sequence[Sequence[str | int]],
        per_call: int = 1000,
        progress: Callable[[int], None] = lambda done: None,
    ) -> int:
        """Appends each history's newest ``window`` items to its session, ``per_call`` sessions a MULTI
        (``progress`` told how many sessions each call added); returns the events acknowledged."""
        stored, window = 0, self.settings.window
        for start in range(0, len(sessions), per_call):
            stop = min(start + per_call, len(sessions))
            events = [Event(sessions[n], item) for n in range(start, stop) for item in list(histories[n])[-window:]]
            stored += self.append(events).accepted
            progress(stop - start)
        return stored

    def recent(self, sessions: Sequence[str], count: int | None = None) -> list[list[str]]:
        """The newest ``count`` (default: the window) items of each session, oldest first; [] for a session
        the store does not know (new, or expired).

        Raises:
            StoreError: the store did not answer; RequestError-like problems of a session ID as ValueError.
        """
        count = self._read_count(sessions, count)
        if not sessions:
            return []
        pipe = self._client.pipeline(transaction=False)
        for session in sessions:
            pipe.lrange(self.settings.key(session), -count, -1)
        return self._call("the read", pipe.execute)

    def _read_count(self, sessions: Sequence[str], count: int | None) -> int:
        """How many items a read takes (at most the window); a bad session ID is a ValueError."""
        for session in sessions:
            if not isinstance(session, str) or not session or len(session) > MAX_SESSION_ID:
                raise ValueError(f"session: a non-empty string of at most {MAX_SESSION_ID} characters")
        return min(count or self.settings.window, self.settings.window)

    def forget(self, sessions: Sequence[str]) -> int:
        """Removes sessions (a shopper's request to be forgotten); returns how many the store held."""
        if not sessions:
            return 0
        return self._call("the removal", lambda: self._client.delete(*(self.settings.key(s) for s in sessions)))
