"""Recommend by session on a real Triton with a real store (recserve's embedded Valkey server, on
loopback behind its password), in both layouts by session (the python model, and recserve's own backend
reading the store in C++): the answer of a session is the answer of its history, events show in the next
answer, and a store that is down answers from the request's items or refuses with a typed error."""

import dataclasses
import json
import shutil
import time

import numpy as np
import pytest

from recserve.bench.step_log import read_step_lines
from recserve.client import RecommenderClient
from recserve.client.triton import SessionStoreError
from recserve.constants import HISTORY_FROM_REQUEST, HISTORY_FROM_STORE, NATIVE_SESSION_MODEL, SESSION_MODEL
from recserve.errors import ServingError
from recserve.serving.triton_repository.layouts import write_repository
from recserve.serving.triton_repository.repository_settings import RepositorySettings
from recserve.serving.triton_server.launcher import TritonServer
from recserve.sessions import embedded_store
from recserve.sessions.session_store import Event, SessionStore
from recserve.sessions.store_contract import CASES
from tests.conftest import require_native, server_settings
from tests.sessions.conftest import store_client, write_session_repository

# the layout by session -> its model; the native one beside the native layout (item IDs) of the same export
BY_SESSION = {"session": SESSION_MODEL, "native_session": NATIVE_SESSION_MODEL}
EVENTS_OF = {"session": "events", "native_session": "events_native"}  # each layout's events-only model


class Session(RecommenderClient):
    """The client, asking the layout's session model by session, and the layout's item-ID model by items."""

    def __init__(self, url: str, layout: str):
        super().__init__(url, model=RECOMMENDER_BY_ITEMS[layout])
        self.session_model = BY_SESSION[layout]

    def recommend_session(self, session, item_ids=None, k=10, exclude_seen=True, model=None):
        return super().recommend_session(session, item_ids, k, exclude_seen, model or self.session_model)


RECOMMENDER_BY_ITEMS = {"session": "recommender", "native_session": "recommender_native"}


@pytest.fixture(scope="module", params=list(BY_SESSION))
def session_stack(request, tiny_export, tiny_torchscript, tmp_path_factory):
    layout = request.param
    root = tmp_path_factory.mktemp(layout)
    store_dir = root / "store"
    if layout == "native_session":
        require_native("recserve")
    embedded_store.start(store_dir)
    repo = root / "repo"
    try:
        write_session_repository(layout, tiny_export, tiny_torchscript, repo, store_dir)
        with TritonServer(repo, server_settings()) as server:
            yield server, store_dir, repo, layout
    finally:
        embedded_store.stop(store_dir)


def test_a_sessions_answer_is_its_historys_and_an_event_shows_in_the_next_answer(session_stack):
    server, store_dir, _, layout = session_stack
    history = [50, 172, 133, 204, 96]
    with SessionStore(embedded_store.settings_of(store_dir)) as store:
        store.append([Event("shopper-1", item) for item in history[:3]])
    with Session(server.grpc_url, layout) as client:
        by_items = client.recommend(history[:3], k=10)
        by_session = client.recommend_session("shopper-1", k=10)
        np.testing.assert_array_equal(by_session.item_ids, by_items.item_ids)
        np.testing.assert_allclose(by_session.scores, by_items.scores, rtol=1e-6)
        assert (by_session.history_source, by_session.history_length) == (HISTORY_FROM_STORE, 3)
        # the request's items are appended first, and stay for the next request
        appended = client.recommend_session("shopper-1", history[3:], k=10)
        np.testing.assert_array_equal(appended.item_ids, client.recommend(history, k=10).item_ids)
        again = client.recommend_session("shopper-1", k=10)
        assert again.history_length == 5
        np.testing.assert_array_equal(again.item_ids, appended.item_ids)
        new = client.recommend_session("nobody-yet", k=5)  # an unknown session: the popular items
        assert new.history_length == 0 and len(new.item_ids) == 5
        np.testing.assert_array_equal(new.item_ids, client.recommend([], k=5).item_ids)


def test_recserves_backend_times_the_stores_round_trip_apart_from_parsing_its_replies(session_stack):
    """The step summary of the model by session on recserve's backend: the store's round trip (``store``) and
    the reading of its replies into the batch's rows (``parse``) as two steps; the round trip takes time on
    any batch that asked the store. The python model by session logs no steps."""
    server, store_dir, _, layout = session_stack
    with SessionStore(embedded_store.settings_of(store_dir)) as store:
        store.append([Event("timed-shopper", item) for item in (50, 172, 133)])
    with Session(server.grpc_url, layout) as client:
        assert client.recommend_session("timed-shopper", k=5).history_length == 3
    lines = [
        line
        for line in read_step_lines(server.log_path.read_text())
        if line["instance"].startswith(NATIVE_SESSION_MODEL)
    ]
    if layout != "native_session":
        assert not lines
        return
    assert lines, "no step summary of the model by session"
    assert list(lines[0]["steps"]) == ["requests", "store", "parse", "inputs", "graph", "answers"]
    assert lines[0]["steps"]["store"][0] > 0


def test_requests_that_carry_item_ids_keep_working_exactly_as_today(session_stack):
    server, _, _, layout = session_stack
    with Session(server.grpc_url, layout) as client:
        answer = client.recommend([50, 172, 133], k=10)
    assert len(answer.item_ids) == 10 and answer.unknown_ids == 0


def test_bad_session_requests_get_invalid_argument(session_stack):
    server, _, _, layout = session_stack
    with Session(server.grpc_url, layout) as client:
        with pytest.raises(ServingError, match="empty session ID"):
            client.recommend_session("", k=10)
        with pytest.raises(ServingError, match="over 256 characters"):
            client.recommend_session("x" * 300, k=10)
        with pytest.raises(ServingError, match="out of range"):
            client.recommend_session("shopper-2", k=0)
        assert client.recommend_session("shopper-2", k=3).history_length == 0  # the server is unharmed


def test_the_repository_names_the_store_and_never_its_password(session_stack):
    _, store_dir, repo, layout = session_stack
    password = embedded_store.settings_of(store_dir).secret()
    written = [p.read_text() for p in repo.rglob("*") if p.is_file() and p.suffix in (".pbtxt", ".json")]
    assert written and not any(password in text for text in written)
    config = (repo / BY_SESSION[layout] / "config.pbtxt").read_text()
    assert "password_file" in config and str(store_dir / "password") in config


def test_a_request_of_several_sessions_answers_each_row_from_its_own_history(session_stack):
    """Three rows in one request, each appending its own items (padded with -1 to one width) to its own
    session: every row is answered as its whole history asked by items, and says how long it was."""
    import tritonclient.grpc as grpcclient

    server, store_dir, _, layout = session_stack
    with SessionStore(embedded_store.settings_of(store_dir)) as store:
        store.append([Event("row-a", 50), Event("row-a", 172), Event("row-b", 133)])
    appended = np.array([[204, 96, -1], [-1, -1, -1], [7, 8, 9]], dtype=np.int64)
    histories = [[50, 172, 204, 96], [133], [7, 8, 9]]
    inputs = []
    for name, value, dtype in [
        ("session_id", np.array([[b"row-a"], [b"row-b"], [b"row-c"]], dtype=np.object_), "BYTES"),
        ("item_ids", appended, "INT64"),
        ("k", np.full((3, 1), 5, dtype=np.int32), "INT32"),
        ("exclude_seen", np.ones((3, 1), dtype=bool), "BOOL"),
    ]:
        tensor = grpcclient.InferInput(name, list(value.shape), dtype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    reply = client.infer(BY_SESSION[layout], inputs)
    assert reply.as_numpy("history_length")[:, 0].tolist() == [4, 1, 3]
    assert reply.as_numpy("history_source")[:, 0].tolist() == [HISTORY_FROM_STORE] * 3
    with Session(server.grpc_url, layout) as by_items:
        for row, history in enumerate(histories):
            np.testing.assert_array_equal(reply.as_numpy("item_ids")[row], by_items.recommend(history, k=5).item_ids)


def test_a_store_that_is_down_answers_from_the_requests_items_or_refuses(session_stack):
    server, store_dir, _, layout = session_stack
    embedded_store.stop(store_dir)
    try:
        with Session(server.grpc_url, layout) as client:
            fallback = client.recommend_session("shopper-1", [50, 172], k=10)
            assert (fallback.history_source, fallback.history_length) == (HISTORY_FROM_REQUEST, 2)
            np.testing.assert_array_equal(fallback.item_ids, client.recommend([50, 172], k=10).item_ids)
            with pytest.raises(SessionStoreError, match="session store"):
                client.recommend_session("shopper-1", k=10)
            with pytest.raises(SessionStoreError, match="session store"):  # an event alone: refused, not lost
                client.send_events("shopper-1", [7], ["down-1"], model=EVENTS_OF[layout])
    finally:
        embedded_store.start(store_dir)
    with Session(server.grpc_url, layout) as client:  # back: the store's events as before the outage
        assert client.recommend_session("shopper-1", k=10).history_length == 5


def test_perf_analyzer_asks_by_session_with_events_mixed_in(session_stack, ml100k_dir, tmp_path):
    from recserve.bench.load_settings import LoadSettings
    from recserve.bench.perf_analyzer import BENCH_SESSION, LoadLevel
    from recserve.bench.sweep import real_histories, sweep

    _, store_dir, repo, layout = session_stack
    histories, string_ids = real_histories(ml100k_dir)
    result = sweep(
        [layout],
        [LoadLevel("concurrency", 2)],
        tmp_path,
        histories,
        string_ids,
        repo=repo,
        load=LoadSettings(measurement_ms=500, client_threads=2, events_every=4),
    )
    (row,) = result["results"]
    assert row["errors"] == 0 and row["throughput_rps"] > 10, row
    assert result["server_failures"] == {layout: 0}
    # the sweep loaded each session's history, then one request in 4 appended its last item again
    with SessionStore(embedded_store.settings_of(store_dir)) as store:
        first, second = store.recent([BENCH_SESSION.format(0), BENCH_SESSION.format(1)], 10_000)
    window = embedded_store.settings_of(store_dir).window
    assert len(second) == min(len(histories[1]), window), "a session no request appended to is as loaded"
    assert first[-2:] == [str(histories[0][-1])] * 2, "requests of session 0 appended its last item again"
    assert "one request in 4 carries an event" in (tmp_path / "report.md").read_text()


def test_a_session_layout_without_a_store_is_refused(tiny_export, tmp_path):
    with pytest.raises(ServingError, match="needs a session store"):
        write_repository(tiny_export, tmp_path / "repo", ("session",), RepositorySettings())
    leaky = tmp_path / "store.json"
    leaky.write_text(json.dumps({"url": "redis://127.0.0.1:6379/0", "password": "secret"}))
    with pytest.raises(ServingError, match="holds a password"):
        write_repository(tiny_export, tmp_path / "repo", ("session",), RepositorySettings(session_store=str(leaky)))


def test_the_native_session_layout_needs_a_torchscript_export_on_recserves_backend(
    tiny_export, tiny_torchscript, tmp_path
):
    record = tmp_path / "store.json"
    record.write_text(json.dumps({"url": "redis://127.0.0.1:6379/0"}))
    settings = RepositorySettings(session_store=str(record))
    with pytest.raises(ServingError, match="eager export holds no native model"):
        write_repository(tiny_export, tmp_path / "repo", ("native_session",), settings)
    on_pytorch = dataclasses.replace(settings, native_runtime="pytorch")
    with pytest.raises(ServingError, match="reads the session store in recserve's own backend"):
        write_repository(tiny_torchscript, tmp_path / "repo", ("native_session",), on_pytorch)


@pytest.fixture(scope="module")
def native_session_repo(tiny_torchscript, tmp_path_factory):
    """A repository of the native_session layout alone, its store's record pointing at no server."""
    require_native("recserve")
    root = tmp_path_factory.mktemp("native-session-alone")
    (root / "store.json").write_text(json.dumps({"url": "redis://127.0.0.1:9/0"}))
    settings = RepositorySettings(session_store=str(root / "store.json"), native_runtime="recserve")
    write_repository(tiny_torchscript, root / "repo", ("native_session",), settings)
    return root / "repo"


@pytest.mark.parametrize(
    "record, message",
    [
        ({"url": "redis://recserve:secret@127.0.0.1:6379/0"}, "give the credentials as username and password_file"),
        ({"url": "rediss://127.0.0.1:6379/0"}, "reaches a store at redis://HOST:PORT/DB (no TLS"),
        ({"url": "redis://:6379/0"}, "names no host and port"),
        ({"window": 0}, "window must be 1 to 1,000,000"),
        ({"window": 1e300}, "window must be 1 to 1,000,000"),
        (None, "needs the parameter history_length"),
    ],
)
def test_recserves_backend_refuses_a_store_record_it_cannot_use(native_session_repo, tmp_path, record, message):
    """A hand-edited config.pbtxt: the server does not start, and its log says what is wrong with the record."""
    from recserve.serving.triton_repository.pbtxt import parse_pbtxt

    repo = tmp_path / "repo"
    shutil.copytree(native_session_repo / NATIVE_SESSION_MODEL, repo / NATIVE_SESSION_MODEL)
    path = repo / NATIVE_SESSION_MODEL / "config.pbtxt"
    config = parse_pbtxt(path.read_text())
    if record is None:
        del config.parameters["history_length"]
    else:
        stored = json.loads(config.parameters["session_store"].string_value)
        config.parameters["session_store"].string_value = json.dumps(stored | record)
    path.write_text(str(config))
    with pytest.raises(ServingError) as err, TritonServer(repo, server_settings()):
        pass
    assert message in str(err.value), str(err.value)[-2000:]
    assert "secret" not in str(err.value)


@pytest.mark.parametrize(
    "parameters, message",
    [
        ({"floor": "true"}, "parameter floor answers the recommender_native contract alone"),
        ({"events_only": "true", "session_store": None}, "parameter events_only needs the parameter session_store"),
    ],
)
def test_recserves_backend_refuses_a_floor_or_events_model_it_cannot_be(
    native_session_repo, tmp_path, parameters, message
):
    """The floor and the events model are modes of recserve's backend a config names: a config that asks one
    of a model it cannot be (the floor by session, events alone with no store) does not load, and says why."""
    from recserve.serving.triton_repository.pbtxt import parse_pbtxt

    repo = tmp_path / "repo"
    shutil.copytree(native_session_repo / NATIVE_SESSION_MODEL, repo / NATIVE_SESSION_MODEL)
    path = repo / NATIVE_SESSION_MODEL / "config.pbtxt"
    config = parse_pbtxt(path.read_text())
    for name, value in parameters.items():
        if value is None:
            del config.parameters[name]
        else:
            config.parameters[name].string_value = value
    path.write_text(str(config))
    with pytest.raises(ServingError) as err, TritonServer(repo, server_settings()):
        pass
    assert message in str(err.value), str(err.value)[-2000:]


JUNK = [text for what, text, accepted in CASES if what == "integer" and not accepted]
VALID = [int(text) for what, text, accepted in CASES if what == "integer" and accepted]


def test_whatever_one_session_holds_every_other_request_gets_its_own_answer(session_stack):
    """A writer with the application's password stores every junk item of the store contract's cases (and
    members without an event ID) in one session; an operator puts another type of value at a second
    session's key. 200 concurrent requests, one in four for those sessions: every one is answered, and the
    poisoned session's answer is that of its valid items alone (both layouts read the store by one rule)."""
    from concurrent.futures import ThreadPoolExecutor

    server, store_dir, _, layout = session_stack
    settings = embedded_store.settings_of(store_dir)
    members = {f"junk-{n} {text}": n for n, text in enumerate(JUNK)} | {"no-event-id": 50}
    members |= {f"ok-{n} {item}": 100 + n for n, item in enumerate([*VALID, 50, 172])}
    store_client(settings).zadd(settings.key("poisoned"), members)
    store_client(embedded_store.admin_settings(store_dir)).set(settings.key("wrong-type"), "not a session")
    with SessionStore(settings) as store:
        store.append([Event(f"healthy-{n}", item) for n in range(8) for item in (50, 172, 133)])
    sessions = ["poisoned" if n % 8 == 0 else "wrong-type" if n % 4 == 0 else f"healthy-{n % 8}" for n in range(200)]

    def ask(session):
        with Session(server.grpc_url, layout) as client:
            return client.recommend_session(session, k=5)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, sessions))
    assert [len(a.item_ids) for a in answers] == [5] * 200
    poisoned = answers[0]
    assert poisoned.history_length == len(VALID) + 2  # the junk and the member without an ID left out
    with Session(server.grpc_url, layout) as client:
        np.testing.assert_array_equal(poisoned.item_ids, client.recommend([*VALID, 50, 172], k=5).item_ids)
        assert answers[4].history_length == 0  # a key of another type reads as an empty session
        np.testing.assert_array_equal(answers[1].item_ids, client.recommend([50, 172, 133], k=5).item_ids)


def test_a_store_failure_tells_the_client_nothing_of_the_stores_address_or_keys(session_stack):
    server, store_dir, _, layout = session_stack
    settings = embedded_store.settings_of(store_dir)
    embedded_store.stop(store_dir)
    try:
        with Session(server.grpc_url, layout) as client, pytest.raises(SessionStoreError) as err:
            client.recommend_session("shopper-secret-key", k=3)
    finally:
        embedded_store.start(store_dir)
    message = str(err.value)
    assert "session store is unavailable" in message
    for secret in (settings.url, str(settings.url.split("//")[1].split("/")[0]), settings.prefix, str(store_dir)):
        assert secret not in message, message


def test_a_password_rotated_under_load_fails_no_request(session_stack):
    """While two threads ask by session, the operator rotates the application's password (ACL SETUSER, the
    file, then the old connections dropped): both layouts read the new one when they connect again."""
    import hashlib
    import threading

    server, store_dir, _, layout = session_stack
    settings = embedded_store.settings_of(store_dir)
    with SessionStore(settings) as store:
        store.append([Event("rotating", 50), Event("rotating", 172)])
    old = settings.secret()
    answered, failed, stop = [], [], threading.Event()

    def load():
        with Session(server.grpc_url, layout) as client:
            while not stop.is_set():
                try:
                    answered.append(client.recommend_session("rotating", k=3).history_length)
                except Exception as err:  # counted: the test's point
                    failed.append(repr(err))

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    admin = store_client(embedded_store.admin_settings(store_dir))
    try:
        time.sleep(0.5)
        new = "rotated-" + old[::-1]
        admin.execute_command("ACL", "SETUSER", "recserve", "resetpass", "#" + hashlib.sha256(new.encode()).hexdigest())
        (store_dir / "password").write_text(new + "\n")
        admin.execute_command("CLIENT", "KILL", "USER", "recserve")
        time.sleep(1.0)
        before = len(answered)
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
        admin.execute_command("ACL", "SETUSER", "recserve", "resetpass", "#" + hashlib.sha256(old.encode()).hexdigest())
        (store_dir / "password").write_text(old + "\n")
        admin.execute_command("CLIENT", "KILL", "USER", "recserve")
    assert failed == [], failed[:3]
    assert len(answered) > before > 10 and set(answered) == {2}


def test_recommend_by_session_says_what_it_appended_and_shows_no_empty_title_column(session_stack):
    from typer.testing import CliRunner

    from recserve.cli.main import app

    server, _, _, layout = session_stack
    args = ["recommend", "50", "172", "--session", "cli-shopper", "--url", server.grpc_url, "--k", "3"]
    args += ["--model", BY_SESSION[layout]]
    table = CliRunner().invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "2 item(s) appended to session 'cli-shopper' first" in table.output
    assert "title" not in table.output  # no items.parquet given: no column of blanks
    answer = json.loads(CliRunner().invoke(app, [*args[:1], *args[3:], "--json"]).output)
    assert answer["history_length"] == 2 and "appended" not in answer  # nothing appended the second time
