"""The session store tried as an attacker and a careless operator would: the application's password opens
only recserve's commands and prefix, an acknowledged event is stored exactly once across a slow network
and a killed server, the store's folder is its owner's alone, and a store is never mistaken for another
process. Against the real embedded Valkey server on loopback."""

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from recserve.cli.main import app
from recserve.errors import ConfigError, StoreError
from recserve.processes import cmdline
from recserve.sessions import embedded_store, store_contract
from recserve.sessions.session_store import Event, SessionStore
from recserve.sessions.store_settings import StoreSettings
from tests.sessions.conftest import store_client
from tests.sessions.delaying_proxy import DelayingProxy

# every command that the application's password opened before the allow-list (and a few more)
REFUSED = [
    ("SCAN", 0),
    ("RANDOMKEY",),
    ("DBSIZE",),
    ("KEYS", "*"),
    ("SELECT", 1),
    ("PUBLISH", "channel", "message"),
    ("PSUBSCRIBE", "*"),
    ("SUBSCRIBE", "recserve:channel"),
    ("EVAL", "while true do end", 0),
    ("EVALSHA", "0" * 40, 0),
    ("SCRIPT", "LOAD", "return 1"),
    ("FUNCTION", "LIST"),
    ("SET", "recserve:h:not-a-session", "x"),
    ("SETRANGE", "recserve:big", 100_000_000, "x"),
    ("RPUSH", "recserve:h:list", "1"),
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("CONFIG", "GET", "*"),
    ("INFO",),
    ("CLIENT", "LIST"),
    ("MONITOR",),
    ("ACL", "LIST"),
    ("SHUTDOWN",),
    ("DEBUG", "SLEEP", 0),
    ("MODULE", "LIST"),
    ("ZADD", "other:h:shopper", 1, "e 1"),  # an allowed command outside the prefix
    ("ZRANGE", "other:h:shopper", 0, -1),
]


@pytest.mark.parametrize("command", REFUSED, ids=[" ".join(map(str, c[:2])) for c in REFUSED])
def test_the_applications_password_is_refused_every_command_but_recserves(store_dir, command):
    with pytest.raises(redis.ResponseError) as err:
        store_client(embedded_store.settings_of(store_dir)).execute_command(*command)
    assert "no permissions" in str(err.value).lower() or "not allowed" in str(err.value).lower()


def test_recserves_own_commands_are_the_allow_list_and_work(store_dir):
    rules = (store_dir / embedded_store.ACL_FILE).read_text()
    assert "-@all" in rules and "resetchannels" in rules and "+@all -@dangerous" not in rules
    for role, (user, _) in embedded_store.ROLE_USERS.items():
        line = next(line for line in rules.splitlines() if line.startswith(f"user {user} "))
        assert sorted(c.lstrip("+") for c in line.split("-@all ")[1].split()) == sorted(
            store_contract.ROLE_COMMANDS[role]
        )
    with SessionStore(embedded_store.settings_of(store_dir)) as store:
        store.ping()
        assert store.append([Event("s", 1)]).accepted == 1
        assert store.recent(["s"]) == [["1"]]
        assert store.forget(["s"]) == 1


CATALOGUE_WRITES = [
    ("SADD", "recserve:items:hidden", "junk"),
    ("SREM", "recserve:items:hidden", "1"),
    ("DEL", "recserve:items:hidden"),
    ("DEL", "recserve:items:version"),
    ("INCRBY", "recserve:items:version", 2**62),
    ("XADD", "recserve:items:changes", "*", "1", "+"),
    ("DEL", "recserve:items:changes"),
    ("SET", "recserve:items:change:x", "1"),
]


@pytest.mark.parametrize("role", ["serving", "writer"])
@pytest.mark.parametrize("command", CATALOGUE_WRITES, ids=[" ".join(map(str, c[:2])) for c in CATALOGUE_WRITES])
def test_the_applications_and_the_writers_passwords_are_refused_on_every_catalogue_key(store_dir, role, command):
    """Once the application's user could set the hidden items' version to 2**63-1 (every later hide failed) or
    delete it (recserve's backend then never read the set): only the catalogue operator's user may write them."""
    with pytest.raises(redis.exceptions.NoPermissionError):
        store_client(embedded_store.role_settings(store_dir, role)).execute_command(*command)


def test_each_role_does_its_work_and_nothing_of_another_roles(store_dir):
    serving, writer, operator = (embedded_store.role_settings(store_dir, r) for r in ("serving", "writer", "operator"))
    with SessionStore(writer) as events, SessionStore(operator) as catalogue, SessionStore(serving) as models:
        assert events.append([Event("w", 5, event_id="w-1")]).accepted == 1  # a writer appends
        with pytest.raises(StoreError, match="no permission"):
            events.recent(["w"])  # and reads nothing
        with pytest.raises(StoreError, match="no permission"):
            events.forget(["w"])
        assert catalogue.hide(["5"]).changed == 1  # the operator hides
        with pytest.raises(StoreError, match="no permission"):
            catalogue.recent(["w"])  # and reaches no session
        assert models.recent(["w"]) == [["5"]] and models.hidden()[1] == ["5"]  # serving reads both
        with pytest.raises(StoreError, match="no permission"):
            models.hide(["6"])
        catalogue.hide(["5"], hidden=False)
        models.forget(["w"])


def test_a_hide_retried_after_a_slow_reply_moves_the_version_once_a_hide(store_dir):
    """Through a proxy that holds every reply 0.4 s (past the 0.25 s timeout), each hide's reply is lost and it is
    sent again: found applied by its change ID, the version moves once a hide (it moved +91 for 60 before)."""
    operator = embedded_store.role_settings(store_dir, "operator")
    port = int(operator.url.rsplit(":", 1)[1].split("/")[0])
    with SessionStore(operator) as direct:
        start = direct.hidden_version() or 0
    tries = []
    with DelayingProxy(("127.0.0.1", port), delay_s=0.4, share=0.3, seed=3) as proxy:
        slow = StoreSettings.from_record(operator.describe() | {"url": f"redis://127.0.0.1:{proxy.port}/0"})
        with SessionStore(slow) as store:
            for n in range(12):
                tries.append(0)
                while tries[-1] < 29:  # a caller sends the change again, with its ID, until acknowledged
                    tries[-1] += 1
                    try:
                        store.hide([str(700 + n)], change_id=f"retry-{n}")
                        break
                    except StoreError:
                        continue
    assert proxy.delayed > 3 and max(tries) < 29
    with SessionStore(operator) as direct:
        assert direct.hidden_version() == start + 12, tries
        assert direct.hidden()[1] == sorted(str(700 + n) for n in range(12))
        direct.hide([str(700 + n) for n in range(12)], hidden=False)


def test_a_hide_of_a_million_ids_is_sent_in_changes_each_within_the_timeout(store_dir):
    """A million IDs once always timed out (one transaction past the 0.25 s timeout): now one change of 10,000
    a transaction. On a loaded machine a chunk's reply may still come past the timeout: its retry finds it
    applied (``applied_before``) and applies nothing twice, so the version moves once a chunk."""
    ids = [str(10**12 + n) for n in range(1_000_000)]
    with SessionStore(embedded_store.role_settings(store_dir, "operator")) as store:
        result = store.hide(ids)
        assert result.changed + result.applied_before == 1_000_000 and result.version == 100
        assert len(store.hidden()[1]) == 1_000_000
        shown = store.hide(ids, hidden=False)
        assert shown.changed + shown.applied_before == 1_000_000 and shown.version == 200
        assert store.hidden() == (200, [])


def test_no_prefix_can_list_or_reach_anothers_keys(store_dir):
    settings = embedded_store.settings_of(store_dir)
    with SessionStore(settings) as ours:
        ours.append([Event("alice@example.com", 1)])
    other = store_client(settings)
    for command in (
        ("SCAN", 0, "MATCH", "*"),
        ("KEYS", "*"),
        ("RANDOMKEY",),
        ("ZRANGE", "x:h:alice@example.com", 0, -1),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            other.execute_command(*command)


def test_an_event_sent_twice_with_its_id_is_stored_once(store_dir):
    with SessionStore(embedded_store.settings_of(store_dir)) as store:
        first = [Event("s", 42, event_id="click-1"), Event("s", 43, event_id="click-2")]
        assert store.append(first).accepted == 2
        assert store.append([Event("s", 42, event_id="click-1")]).accepted == 1  # acknowledged again
        assert store.append([Event("s", 44)]).accepted == 1
        assert store.recent(["s"]) == [["42", "43", "44"]]
        # an event ID names one event: sent again with another item (now, or twice in one call), it is refused
        other = store.append(
            [Event("s", 99, event_id="click-1"), Event("s", 7, event_id="c3"), Event("s", 8, event_id="c3")]
        )
        assert other.accepted == 1 and [p for p, _ in other.errors] == [0, 2]
        assert "'click-1' names item '42' already" in other.errors[0][1] and "names item '7'" in other.errors[1][1]
        assert store.recent(["s"]) == [["42", "43", "44", "7"]]
        bad = store.append([Event("s", 45, event_id="has space"), Event("s", 46, event_id="x" * 65)])
        assert bad.accepted == 0 and [p for p, _ in bad.errors] == [0, 1]
        assert "event_id" in bad.errors[0][1]


def _send_until_acknowledged(store: SessionStore, event: Event, tries: int = 20) -> int:
    """A shop's sender: the same event (its ID kept) again until the store acknowledges it; the tries taken."""
    for attempt in range(1, tries + 1):
        try:
            if store.append([event]).accepted == 1:
                return attempt
        except StoreError:
            time.sleep(0.02)
    raise AssertionError(f"{event} never acknowledged")


def _stored(folder, sessions) -> dict[str, list[str]]:
    """Each session's members, by the operator's reading of the store."""
    admin = store_client(embedded_store.admin_settings(folder))
    settings = embedded_store.settings_of(folder)
    return {s: admin.zrange(settings.key(s), 0, -1) for s in sessions}


def test_replies_delayed_past_the_timeout_store_no_event_twice(store_dir):
    """Through a proxy that holds one reply in three 0.3 s (past the 0.1 s timeout), so that the client's
    retry and the sender's own resends meet appends the store had applied: each event is stored once."""
    settings = embedded_store.settings_of(store_dir)
    port = int(settings.url.rsplit(":", 1)[1].split("/")[0])
    with DelayingProxy(("127.0.0.1", port), delay_s=0.3, share=1 / 3, seed=1) as proxy:
        slow = StoreSettings.from_record(
            settings.describe() | {"url": f"redis://127.0.0.1:{proxy.port}/0", "timeout_s": 0.1, "window": 1000}
        )
        with SessionStore(slow) as store:
            tries = [_send_until_acknowledged(store, Event(f"s{n % 4}", n, event_id=f"e{n}")) for n in range(60)]
    assert proxy.delayed > 5 and max(tries) > 1, "the proxy made the client retry"
    stored = _stored(store_dir, [f"s{n}" for n in range(4)])
    members = [m for ms in stored.values() for m in ms]
    assert len(members) == len(set(members)) == 60, "each acknowledged event once, none twice"


def test_a_store_killed_under_eight_writers_loses_and_doubles_no_acknowledged_event(store_dir):
    settings = StoreSettings.from_record(embedded_store.settings_of(store_dir).describe() | {"window": 100_000})
    acknowledged: list[str] = []
    stop = threading.Event()

    def writer(w: int) -> None:
        with SessionStore(settings) as store:
            n = 0
            while not stop.is_set() and n < 2000:
                event = Event(f"w{w}", n, event_id=f"w{w}-{n}")
                try:
                    _send_until_acknowledged(store, event, tries=200)
                except AssertionError:
                    return
                acknowledged.append(f"w{w}-{n} {n}")
                n += 1

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    os.kill(int((store_dir / embedded_store.PID_FILE).read_text()), signal.SIGKILL)
    while embedded_store.running(store_dir):
        time.sleep(0.02)
    embedded_store.start(store_dir)
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join()
    members = [m for ms in _stored(store_dir, [f"w{w}" for w in range(8)]).values() for m in ms]
    assert len(acknowledged) > 500
    assert len(members) == len(set(members)), "no event twice"
    assert not set(acknowledged) - set(members), "no acknowledged event lost"


def test_the_store_folder_and_every_file_in_it_are_its_owners_alone(store_dir):
    with SessionStore(embedded_store.settings_of(store_dir)) as store:
        store.append([Event("s", 1)])  # the append-only file written
    assert oct(store_dir.stat().st_mode & 0o777) == "0o700"
    files = [p for p in store_dir.rglob("*") if p.is_file()]
    assert {"store.json", "password", "server.log", "users.acl"} <= {p.name for p in files}
    assert any("appendonly" in str(p) for p in files)
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: "0o600" for p in files}


@pytest.mark.parametrize("password", ["", "\n", "  padded  \n", "\ttab\n"])
def test_an_empty_or_padded_password_is_refused_and_nothing_is_left_running(tmp_path, password):
    folder = tmp_path / "store"
    folder.mkdir()
    (folder / "password").write_text(password)
    with pytest.raises(ConfigError, match="empty|blank"):
        embedded_store.start(folder)
    assert not embedded_store.running(folder) and not (folder / embedded_store.PID_FILE).exists()
    with pytest.raises(ConfigError, match="empty|blank"):  # every reader refuses it alike
        StoreSettings(password_file=str(folder / "password")).secret()


def test_a_stale_pid_file_never_makes_stop_signal_another_process(store_dir):
    embedded_store.stop(store_dir)
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        (store_dir / embedded_store.PID_FILE).write_text(f"{bystander.pid}\n")
        assert not embedded_store.running(store_dir)
        assert embedded_store.stop(store_dir) is False
        assert bystander.poll() is None, "the bystander was signalled"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_zombie_is_not_a_running_store_and_start_starts_one(store_dir):
    embedded_store.stop(store_dir)
    zombie = subprocess.Popen(["true"])
    while ") Z" not in Path(f"/proc/{zombie.pid}/stat").read_text():
        time.sleep(0.01)  # exited, not yet reaped: a zombie
    (store_dir / embedded_store.PID_FILE).write_text(f"{zombie.pid}\n")
    assert not embedded_store.running(store_dir)
    settings = embedded_store.start(store_dir)
    zombie.wait()
    with SessionStore(settings) as store:
        store.ping()


def test_concurrent_starts_of_one_folder_start_one_server(tmp_path):
    folder = tmp_path / "store"
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(embedded_store.start(folder))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(results) == 4 and len({r.url for r in results}) == 1
        port = results[0].url.rsplit(":", 1)[1].split("/")[0]
        servers = [p for p in os.listdir("/proc") if p.isdigit() and f":{port}".encode() in cmdline(int(p))]
        assert len(servers) == 1, servers
        with SessionStore(results[0]) as store:
            store.ping()
    finally:
        embedded_store.stop(folder)


def test_a_rotated_password_is_taken_up_by_the_next_connection_without_a_restart(store_dir):
    """The operator rotates the password (ACL SETUSER, then the file) and drops the old connections: the
    same SessionStore goes on with the new one."""
    settings = embedded_store.settings_of(store_dir)
    with SessionStore(settings) as store:
        store.append([Event("s", 1)])
        admin = store_client(embedded_store.admin_settings(store_dir))
        new = "rotated-password-0123456789"
        import hashlib

        admin.execute_command("ACL", "SETUSER", "recserve", "resetpass", "#" + hashlib.sha256(new.encode()).hexdigest())
        (store_dir / "password").write_text(new + "\n")
        admin.execute_command("CLIENT", "KILL", "USER", "recserve")
        assert store.recent(["s"]) == [["1"]]


@pytest.fixture(scope="module")
def int_catalogue_repo(tiny_export, tmp_path_factory) -> Path:
    """A repository of ``tiny_export`` (an integer catalogue): what `events send --repo` reads the ID type of."""
    from recserve.serving.triton_repository.layouts import write_repository
    from recserve.serving.triton_repository.repository_settings import RepositorySettings

    repo = tmp_path_factory.mktemp("events-repo") / "repo"
    write_repository(tiny_export, repo, ("fused",), RepositorySettings(), 1)
    return repo


def test_bad_input_to_the_store_and_events_commands_gets_one_line_and_no_traceback(
    store_dir, tmp_path, int_catalogue_repo
):
    runner = CliRunner()
    store = ["--store", str(store_dir)]
    typed = [*store, "--repo", str(int_catalogue_repo)]  # the IDs checked against an integer catalogue
    (tmp_path / "latin1.jsonl").write_bytes(b'{"session": "s", "item": "caf\xe9"}\n')
    (tmp_path / "a-file").write_text("x")
    cases = [
        (["events", "show", "", *store], "session"),
        (["events", "show", "x" * 257, *store], "over 256 characters"),
        (["events", "send", "--file", str(tmp_path / "missing.jsonl"), *store], "cannot read events"),
        (["events", "send", "--file", str(tmp_path / "latin1.jsonl"), *store], "not UTF-8"),
        (["events", "send", *typed, "--", "s", "--5"], "integers"),
        (["events", "send", "s", "\u0663", *typed], "integers"),
        (["events", "send", "s", "99999999999999999999", *typed], "integers"),
        (["events", "send", "s", "sku-1", *typed], "integers"),
        (["events", "send", "s", "1", *store, "--repo", str(tmp_path)], "written by `recserve repo`"),
        (["store", "start", "--dir", str(tmp_path / "a-file" / "store")], "cannot hold the store's folder"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code != 0, args
        assert message in result.output, (args, result.output)
        assert "Traceback" not in result.output and not isinstance(result.exception, (ValueError, OSError)), args
    assert runner.invoke(app, ["events", "show", "s", *store]).output.startswith("no events")
    # without a repository any ID the store's contract allows is stored: a served model drops the other type's
    assert runner.invoke(app, ["events", "send", "s-any", "sku-1", "42", *store]).exit_code == 0
    assert json.loads((store_dir / "store.json").read_text())["prefix"] == "recserve:"


def test_a_password_file_caught_mid_rotation_is_a_store_error_not_a_crash(store_dir):
    """A reconnection that finds the password file empty (a rotation writing it) fails that call with the
    typed store error, and the next call after the file is whole goes on."""
    settings = embedded_store.settings_of(store_dir)
    password = settings.secret()
    with SessionStore(settings) as store:
        store.append([Event("s", 1)])
        (store_dir / "password").write_text("")
        store_client(embedded_store.admin_settings(store_dir)).execute_command("CLIENT", "KILL", "USER", "recserve")
        with pytest.raises(StoreError, match="empty"):
            store.recent(["s"])
        (store_dir / "password").write_text(password + "\n")
        assert store.recent(["s"]) == [["1"]]


def test_events_show_prints_json_and_a_store_that_is_down_is_named_with_what_to_run(store_dir):
    runner = CliRunner()
    store = ["--store", str(store_dir)]
    assert runner.invoke(app, ["events", "send", "s", "10", "20", *store]).exit_code == 0
    shown = runner.invoke(app, ["events", "show", "s", "--json", *store])
    assert json.loads(shown.output) == {"session": "s", "items": ["10", "20"]}
    embedded_store.stop(store_dir)
    try:
        down = runner.invoke(app, ["events", "show", "s", *store])
        assert down.exit_code == 1 and "`recserve store start`" in " ".join(down.output.split())
        assert "Traceback" not in down.output
    finally:
        embedded_store.start(store_dir)
