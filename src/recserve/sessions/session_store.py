"""The session store: events added to one capped sorted set per session, the latest items read back.

Each session is a sorted set under ``StoreSettings.key`` (``store_contract`` says how): each event one member,
its ID and its item, scored by its time. ZADD NX, ZREMRANGEBYRANK to the newest ``window`` and EXPIRE, the
three in one MULTI/EXEC, so a call's events of a session land together, an event is acknowledged only once
the store has applied it, and an event stored already (a retried call, an event sent twice with its ID) is
not stored again. Reads are one pipelined ZRANGE per session. Every call is bounded by ``timeout_s``; since
every write is idempotent, a call that timed out or lost its connection is sent once more, never twice;
an unreachable, slow or refusing store is a ``StoreError``, never a hang.
"""

from __future__ import annotations

import math
import secrets
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import redis
from redis.backoff import NoBackoff
from redis.credentials import CredentialProvider
from redis.retry import Retry
from redis.sentinel import Sentinel

from recserve.errors import ConfigError, RequestError, StoreError
from recserve.sessions import store_contract
from recserve.sessions.store_settings import StoreSettings

KINDS = ("view", "cart", "purchase")  # what an event may say it was; the model reads the items of all kinds
_TIE_S = 1e-6  # events of one call without a time: "now", a microsecond apart, in call order
HIDE_CHUNK = 10_000  # items of one change of the hidden items: a larger hide is several, each within the timeout


@dataclass(frozen=True)
class Event:
    """One shopper's action: ``item`` seen in ``session`` at ``time`` (seconds; None: now, in arrival order).

    ``event_id`` makes it idempotent: an event sent again with the same ID is stored once. Without one,
    recserve makes one per call (its own retries then store it once; a sender's own retry of the call does
    not know it, so a sender that retries gives IDs)."""

    session: str
    item: str | int
    time: float | None = None
    kind: str | None = None
    event_id: str | None = None


@dataclass
class AppendResult:
    """What a call to ``append`` did: how many events the store acknowledged, and each refused one by its
    position in the call with the reason."""

    accepted: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)


def event_problem(event: Event, id_type: str | None = None) -> str | None:
    """Why ``event`` cannot be stored for a catalogue of ``id_type`` ("int64", "string"; None: either), or None."""
    problem = store_contract.session_problem(event.session) or store_contract.item_problem(event.item, id_type)
    if problem:
        return problem
    if event.time is not None and (
        isinstance(event.time, bool) or not isinstance(event.time, (int, float)) or not math.isfinite(event.time)
    ):
        return f"time: seconds as a finite number, got {event.time!r:.40}"
    if event.kind is not None and event.kind not in KINDS:
        return f"kind: one of {', '.join(KINDS)}, got {event.kind!r:.40}"
    if event.event_id is not None:
        return store_contract.event_id_problem(event.event_id)
    return None


class _FileCredentials(CredentialProvider):
    """The store's user and password, read anew at each connection: a rotated password is taken up by the
    next connection (one that the store refused, or dropped, is made anew)."""

    def __init__(self, settings: StoreSettings):
        self.settings = settings

    def get_credentials(self):
        password = self.settings.secret()
        if password is None:
            return ()
        return (self.settings.username, password) if self.settings.username else (password,)


class SessionStore:
    """A Redis-protocol store of sessions (Valkey or Redis), as ``settings`` says."""

    def __init__(self, settings: StoreSettings, id_type: str | None = None):
        """``id_type``: the catalogue's item IDs ("int64" or "string"), which appends are checked against
        (None: either)."""
        self.settings = settings
        self.id_type = id_type
        settings.secret()  # a password file that cannot be used is an error now, not at the first call
        connection: dict[str, Any] = {
            "credential_provider": _FileCredentials(settings),
            "socket_timeout": settings.timeout_s,
            "socket_connect_timeout": settings.timeout_s,
            "retry": Retry(NoBackoff(), 1),  # safe: every write is idempotent (module docstring)
            "decode_responses": True,
        }
        if settings.sentinels:  # the primary as the Sentinels name it, found again after a failover
            timeouts = {"socket_timeout": settings.timeout_s, "socket_connect_timeout": settings.timeout_s}
            sentinel = Sentinel(settings.sentinel_addresses(), sentinel_kwargs=timeouts)
            database = int(urllib.parse.urlsplit(settings.url).path.strip("/") or 0)
            self._client = sentinel.master_for(settings.service, db=database, **connection)
        else:
            self._client = redis.Redis.from_url(settings.url, **connection)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, what: str, fn):
        try:
            return fn()
        except ConfigError as err:  # the password file, read at a new connection, cannot be used right now
            raise StoreError(f"the session store at {self.settings.url}: {err}") from err
        except redis.AuthenticationError as err:
            raise StoreError(f"the session store at {self.settings.url} refused recserve's credentials") from err
        except redis.TimeoutError as err:
            raise StoreError(
                f"the session store at {self.settings.url} did not answer {what} within {self.settings.timeout_s} s"
            ) from err
        except redis.ConnectionError as err:
            raise StoreError(
                f"the session store at {self.settings.url} cannot be reached ({what}): {err}; is it running? "
                "(`recserve store status`; `recserve store start` starts recserve's own)"
            ) from err
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
        """Appends the good events (each session's in time order, an event without a time at the time of the
        call, ties in call order) and reports the bad ones; the good ones are stored whatever the bad. An
        event stored already (its ID and item) is acknowledged and not stored again.

        Raises:
            StoreError: the store did not acknowledge them (none of this call's events is then counted).
        """
        events = list(events)
        pipe = self._client.pipeline(transaction=False)
        queued = self._queue_append(pipe, events, self._stored_event_ids(events))
        if queued.sessions:
            replies = self._call("the append", lambda: _execute(pipe))
            self._call("the append", lambda: queued.settle(replies))
        return queued.result

    def _stored_event_ids(self, events: list[Event]) -> dict[tuple[str, str], str]:
        """The items the store holds under the senders' event IDs of ``events`` ((session, event ID) -> item), read
        in one round trip before an append that carries any (recserve's own IDs are new each call): an event ID
        names one event, so an event sent again with its ID and another item is refused, not stored twice. A
        user that may not read (the writer's role) appends without this check."""
        sessions = list(dict.fromkeys(e.session for e in events if e.event_id is not None and not event_problem(e)))
        if not sessions:
            return {}
        pipe = self._client.pipeline(transaction=False)
        for session in sessions:
            pipe.zrange(self.settings.key(session), 0, -1)
        try:
            replies = self._call("the read before the append", lambda: _execute(pipe))
        except StoreError as err:
            if "no permission" not in str(err):
                raise
            return {}  # a writer's user may append but not read: ZADD NX alone keeps an event stored once
        stored: dict[tuple[str, str], str] = {}
        for session, members in zip(sessions, replies):
            for m in _members(members):
                event_id, _, item = m.partition(store_contract.MEMBER_SEPARATOR)
                stored[(session, event_id)] = item
        return stored

    def append_and_read(
        self, events: Iterable[Event], sessions: Sequence[str], count: int | None = None
    ) -> tuple[AppendResult, list[list[str]]]:
        """``append(events)``, then each session's newest ``count`` members (``store_contract.stored_ids``
        reads their items at once), in one transaction and one round trip: the read holds the append.

        Raises:
            StoreError: the store did not answer (nothing of this call is then counted as acknowledged).
        """
        count = self._read_count(sessions, count)
        events = list(events)
        pipe = self._client.pipeline(transaction=False)
        queued = self._queue_append(pipe, events, self._stored_event_ids(events))
        for session in sessions:
            pipe.zrange(self.settings.key(session), -count, -1)
        replies = self._call("the append and read", lambda: _execute(pipe))
        if queued.sessions:  # the read holds the append: the answer stands without a replica's copy
            queued.settle(replies, strict=False)
        return queued.result, [_members(reply) for reply in replies[len(replies) - len(sessions) :]]

    def _queue_append(self, pipe, events: Iterable[Event], stored: dict[tuple[str, str], str] | None = None) -> _Queued:
        """Queues the good events on ``pipe`` in one MULTI/EXEC, each session's ZADD NX, ZREMRANGEBYRANK and
        EXPIRE (then a WAIT for a replica where ``acknowledge`` says so), and reports the bad ones: among them an
        event whose ID names another item in the store (``stored``) or earlier in the call."""
        stored = dict(stored or {})
        wait_ms = int(self.settings.timeout_s * 1000) if self.settings.acknowledge == "replica" else None
        queued = _Queued(AppendResult(), [], 3 if self.settings.ttl_s else 2, wait_ms)
        by_session: dict[str, tuple[dict[str, float], list[int]]] = {}
        now, call = time.time(), secrets.token_hex(8)
        for position, event in enumerate(events):
            problem = event_problem(event, self.id_type)
            if not problem and event.event_id is not None:
                held = stored.setdefault((event.session, event.event_id), str(event.item))
                if held != str(event.item):
                    problem = (
                        f"event_id: {event.event_id!r} names item {held!r:.80} already; an event ID names one event"
                    )
            if problem:
                queued.result.errors.append((position, problem))
                continue
            when = now + position * _TIE_S if event.time is None else float(event.time)
            event_id = event.event_id or f"{call}-{position:06d}"  # sorts in call order among equal times
            members, positions = by_session.setdefault(event.session, ({}, []))
            members[store_contract.member(event_id, event.item)] = when
            positions.append(position)
        if by_session:
            pipe.execute_command("MULTI")
        for session, (members, positions) in by_session.items():
            key = self.settings.key(session)
            pipe.zadd(key, members, nx=True)  # an event stored already keeps its place
            pipe.zremrangebyrank(key, 0, -self.settings.window - 1)
            if self.settings.ttl_s:
                pipe.expire(key, self.settings.ttl_s)
            queued.sessions.append(positions)
        if by_session:
            pipe.execute_command("EXEC")
            if wait_ms is not None:  # on the same connection, right after the EXEC it waits for
                pipe.execute_command("WAIT", 1, wait_ms)
        queued.result.accepted = sum(len(positions) for positions in queued.sessions)
        return queued

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
        """The item IDs (text) of each session's newest ``count`` (default: the window) events, oldest
        first; [] for a session the store does not know (new, or expired) or cannot read as a session (a key
        of another type: it is that session's loss alone).

        Raises:
            StoreError: the store did not answer.
            RequestError: a session ID breaks the store's rule (``store_contract.session_problem``).
        """
        count = self._read_count(sessions, count)
        if not sessions:
            return []
        pipe = self._client.pipeline(transaction=False)
        for session in sessions:
            pipe.zrange(self.settings.key(session), -count, -1)
        return [items(_members(r)) for r in self._call("the read", lambda: _execute(pipe))]

    def _read_count(self, sessions: Sequence[str], count: int | None) -> int:
        """How many items a read takes (at most the window); a bad session ID is a ``RequestError``."""
        for session in sessions:
            if problem := store_contract.session_problem(session):
                raise RequestError(problem)
        return min(count or self.settings.window, self.settings.window)

    def hide(self, items: Sequence[str | int], hidden: bool = True, change_id: str | None = None) -> HiddenChangeResult:
        """Hides items catalogue-wide (``hidden``), or shows them again, as one change (or, past
        ``HIDE_CHUNK`` items, one change a chunk, each within the store's timeout). A change, its entry in the
        stream of changes, its change ID and the raised version are one transaction: a batch that reads the
        new version reads the new set (or the entries that bring it there). A change is applied once by its
        ID (``change_id``, else one made for this call): a change whose reply was lost is sent again and found
        applied, so the version moves once a change.

        Raises:
            StoreError: the store did not acknowledge it (the chunks acknowledged before stay applied).
            RequestError: an item ID that breaks the store's rule for the catalogue's type, or a bad change ID.
        """
        for item in items:
            if problem := store_contract.item_problem(item, self.id_type):
                raise RequestError(problem)
        change = change_id or secrets.token_hex(12)
        if not store_contract.CHANGE_ID_PATTERN.fullmatch(change) or len(change) > 56:
            raise RequestError(f"change_id: 1 to 56 letters, digits or '._:-', got {change!r:.80}")
        texts = list(dict.fromkeys(str(item) for item in items))  # once each: an entry's field names
        result = HiddenChangeResult(0, 0, 0)
        for n, start in enumerate(range(0, len(texts), HIDE_CHUNK)):
            part = self._change_once(texts[start : start + HIDE_CHUNK], hidden, f"{change}.{n}")
            result = HiddenChangeResult(
                result.changed + part.changed, result.applied_before + part.applied_before, part.version
            )
        return result

    def _change_once(self, texts: list[str], hidden: bool, change: str) -> HiddenChangeResult:
        """One change of the hidden items by its ID: applied, or found applied by an earlier try of it."""
        prefix = self.settings.prefix
        change_key = store_contract.CHANGE_KEY.format(prefix=prefix, change=change)
        version_key = store_contract.HIDDEN_VERSION_KEY.format(prefix=prefix)
        op = store_contract.HIDE if hidden else store_contract.SHOW
        fields = dict.fromkeys(texts, op)
        if len(texts) > store_contract.HIDDEN_CHANGE_MAX_ITEMS:  # too many to keep twice: read the set instead
            fields = {store_contract.WHOLE_SET_ITEM: store_contract.WHOLE_SET}

        def attempt() -> HiddenChangeResult:
            with self._client.pipeline(transaction=True) as pipe:
                pipe.watch(change_key)  # a try of this change that lands meanwhile fails this one
                if pipe.exists(change_key):
                    return HiddenChangeResult(0, len(texts), int(pipe.get(version_key) or 0))
                pipe.multi()
                pipe.set(change_key, "1", ex=store_contract.CHANGE_KEPT_S)
                key = store_contract.HIDDEN_KEY.format(prefix=prefix)
                (pipe.sadd if hidden else pipe.srem)(key, *texts)
                changes = store_contract.HIDDEN_CHANGES_KEY.format(prefix=prefix)
                pipe.xadd(changes, fields, maxlen=store_contract.HIDDEN_CHANGES_KEPT, approximate=False)
                pipe.incr(version_key)
                replies = pipe.execute()
                return HiddenChangeResult(int(replies[1]), 0, int(replies[3]))

        last: Exception | None = None
        for _ in range(4):  # a lost reply (a timeout, a dropped connection) or a try that landed meanwhile
            try:
                return self._call("the change of hidden items", attempt)
            except StoreError as err:
                if not isinstance(err.__cause__, redis.ConnectionError | redis.TimeoutError):
                    raise
                last = err
            except redis.WatchError as err:
                last = err
        raise StoreError(
            f"the session store at {self.settings.url} did not acknowledge the change of hidden items in 4 tries "
            f"({last}); send it again with its change ID {change.rpartition('.')[0]!r}: it is applied once"
        ) from last

    def hidden_version(self) -> int | None:
        """The hidden items' version, raised by every change; None where the store holds none (before the
        first change, or removed since) or holds no count there."""
        key = store_contract.HIDDEN_VERSION_KEY.format(prefix=self.settings.prefix)
        return _version(self._call("the hidden items' version", lambda: self._client.get(key)))

    def hidden(self) -> tuple[int, list[str]]:
        """The hidden items (text) and the version they are at, read together."""
        state = self.hidden_state()
        return state.version, sorted(state.items)

    def hidden_state(self) -> HiddenState:
        """The hidden items, their version and the last change's entry, read together (a full read)."""
        prefix = self.settings.prefix
        pipe = self._client.pipeline(transaction=True)
        pipe.get(store_contract.HIDDEN_VERSION_KEY.format(prefix=prefix))
        pipe.smembers(store_contract.HIDDEN_KEY.format(prefix=prefix))
        pipe.xrevrange(store_contract.HIDDEN_CHANGES_KEY.format(prefix=prefix), count=1)
        version, members, last = self._call("the read of hidden items", lambda: pipe.execute())
        return HiddenState(_version(version) or 0, list(members), last[0][0] if last else "")

    def hidden_changes(self, entry: str, version: int) -> HiddenChanges | None:
        """The changes of the hidden items after ``entry`` (the entry a ``hidden_state`` or an earlier call
        ended at, at ``version``), and the version they bring the set to; None where the store no longer keeps
        ``entry`` (or ``entry`` is ""), where a change was too large to keep as items (``WHOLE_SET``), or where
        the version moved by more or less than one a change (a writer that changed the set without its entry,
        as a recserve before the stream did): a full read (``hidden_state``) then."""
        if not entry:
            return None
        prefix = self.settings.prefix
        pipe = self._client.pipeline(transaction=True)
        pipe.get(store_contract.HIDDEN_VERSION_KEY.format(prefix=prefix))
        # XRANGE's start is inclusive: ``entry`` first where the stream still keeps it
        pipe.xrange(store_contract.HIDDEN_CHANGES_KEY.format(prefix=prefix), min=entry)
        text, entries = self._call("the read of hidden items' changes", lambda: pipe.execute())
        now = _version(text)
        if now is None or not entries or entries[0][0] != entry or now - version != len(entries) - 1:
            return None
        # each entry: its items (the field names), all hidden or all shown (the values); applied in order
        ops = [next(iter(fields.values()), store_contract.WHOLE_SET) for _, fields in entries[1:]]
        if store_contract.WHOLE_SET in ops:  # a change too large to keep as items
            return None
        changes = [(op == store_contract.HIDE, list(fields)) for op, (_, fields) in zip(ops, entries[1:])]
        return HiddenChanges(now, changes, entries[-1][0])

    def forget(self, sessions: Sequence[str]) -> int:
        """Removes sessions (a shopper's request to be forgotten); returns how many the store held."""
        if not sessions:
            return 0
        return self._call("the removal", lambda: self._client.delete(*(self.settings.key(s) for s in sessions)))


class HiddenChangeResult(NamedTuple):
    """What a change of the hidden items did: the items it added to (or took from) the set, those of a change
    found applied by an earlier try of it (its reply lost), and the version after it."""

    changed: int
    applied_before: int
    version: int


class HiddenState(NamedTuple):
    """The hidden items as one read found them: their version, the items (text), and the stream's last entry
    ("" where it holds none), from which ``SessionStore.hidden_changes`` reads on."""

    version: int
    items: list[str]
    entry: str


class HiddenChanges(NamedTuple):
    """The hidden items' changes after an entry: the version they bring the set to, each change in order
    (hidden or shown, its items), and the last entry, from which the next read goes on."""

    version: int
    changes: list[tuple[bool, list[str]]]
    entry: str


@dataclass
class _Queued:
    """An append queued on a transaction: its result so far, each session's event positions in queue
    order, and the commands queued a session."""

    result: AppendResult
    sessions: list[list[int]]
    commands: int
    wait_ms: int | None  # a WAIT for one replica after EXEC, or None

    def settle(self, replies: list, strict: bool = True) -> None:
        """Counts the events of a session whose ZADD the store refused (a key holding another type: that
        session's loss alone, as errors), from the pipe's ``replies`` (MULTI's, the QUEUED ones, EXEC's,
        WAIT's).

        Raises:
            StoreError: ``strict`` and no replica confirmed the append within the wait (nothing of it is then
                acknowledged; a read in the same call holds it all the same).
        """
        transaction = replies[1 + self.commands * len(self.sessions)]
        if strict and self.wait_ms is not None and replies[2 + self.commands * len(self.sessions)] < 1:
            raise StoreError(f"no replica confirmed the append within {self.wait_ms} ms (acknowledge: replica)")
        for n, positions in enumerate(self.sessions):
            if isinstance(transaction[n * self.commands], Exception):
                self.result.accepted -= len(positions)
                problem = "the store holds something else at this session's key; nothing was added to it"
                self.result.errors.extend((position, problem) for position in positions)
        self.result.errors.sort()


def _version(text: str | None) -> int | None:
    """A version as the store holds it: a count in decimal, else None (none there, or something else)."""
    if text is None or not store_contract.INTEGER_ID_PATTERN.fullmatch(text) or text.startswith("-"):
        return None
    return int(text)


def items(members: Sequence[str]) -> list[str]:
    """The item IDs (text) of a session's members, oldest first."""
    return [m.partition(store_contract.MEMBER_SEPARATOR)[2] for m in members]


def _execute(pipe) -> list:
    """The pipe's replies; a key of another type is that key's reply alone (``_members``, ``settle``), any other
    refusal (no permission, say) is the call's, raised."""
    replies = pipe.execute(raise_on_error=False)
    for reply in replies:
        if isinstance(reply, redis.ResponseError) and not str(reply).startswith("WRONGTYPE"):
            raise reply
    return replies


def _members(reply) -> list[str]:
    """A read's reply for one session: its members, or [] where the store refused that key alone (WRONGTYPE)."""
    return reply if isinstance(reply, list) else []
