"""Recommend by session on a real Triton with a real store (recserve's embedded Redis server, on
loopback behind its password): the answer of a session is the answer of its history, events show in the
next answer, and a store that is down answers from the request's items or refuses with a typed error."""

import json

import numpy as np
import pytest

from recserve.client import RecommenderClient
from recserve.client.triton import SessionStoreError
from recserve.constants import HISTORY_FROM_REQUEST, HISTORY_FROM_STORE, SESSION_MODEL
from recserve.errors import ServingError
from recserve.serving.triton_repository.layouts import write_repository
from recserve.serving.triton_repository.repository_settings import RepositorySettings
from recserve.serving.triton_server.launcher import TritonServer
from recserve.sessions import embedded_store
from recserve.sessions.session_store import Event, SessionStore
from tests.conftest import server_settings


@pytest.fixture(scope="module")
def session_stack(tiny_export, tmp_path_factory):
    root = tmp_path_factory.mktemp("sessions")
    store_dir = root / "store"
    embedded_store.start(store_dir)
    repo = root / "repo"
    settings = RepositorySettings(max_queue_delay_microseconds=2000, session_store=str(store_dir))
    write_repository(tiny_export, repo, ("fused", "session"), settings)
    try:
        with TritonServer(repo, server_settings()) as server:
            yield server, store_dir, repo
    finally:
        embedded_store.stop(store_dir)


def test_a_sessions_answer_is_its_historys_and_an_event_shows_in_the_next_answer(session_stack):
    server, store_dir, _ = session_stack
    history = [50, 172, 133, 204, 96]
    with SessionStore(embedded_store.settings_of(store_dir)) as store:
        store.append([Event("shopper-1", item) for item in history[:3]])
    with RecommenderClient(server.grpc_url) as client:
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


def test_requests_that_carry_item_ids_keep_working_exactly_as_today(session_stack):
    server, _, _ = session_stack
    with RecommenderClient(server.grpc_url) as client:
        answer = client.recommend([50, 172, 133], k=10)
    assert len(answer.item_ids) == 10 and answer.unknown_ids == 0


def test_bad_session_requests_get_invalid_argument(session_stack):
    server, _, _ = session_stack
    with RecommenderClient(server.grpc_url) as client:
        with pytest.raises(ServingError, match="empty session ID"):
            client.recommend_session("", k=10)
        with pytest.raises(ServingError, match="over 256 characters"):
            client.recommend_session("x" * 300, k=10)
        with pytest.raises(ServingError, match="out of range"):
            client.recommend_session("shopper-2", k=0)
        assert client.recommend_session("shopper-2", k=3).history_length == 0  # the server is unharmed


def test_the_repository_names_the_store_and_never_its_password(session_stack):
    _, store_dir, repo = session_stack
    password = embedded_store.settings_of(store_dir).secret()
    written = [p.read_text() for p in repo.rglob("*") if p.is_file() and p.suffix in (".pbtxt", ".json")]
    assert written and not any(password in text for text in written)
    config = (repo / SESSION_MODEL / "config.pbtxt").read_text()
    assert "password_file" in config and str(store_dir / "password") in config


def test_a_store_that_is_down_answers_from_the_requests_items_or_refuses(session_stack):
    server, store_dir, _ = session_stack
    embedded_store.stop(store_dir)
    try:
        with RecommenderClient(server.grpc_url) as client:
            fallback = client.recommend_session("shopper-1", [50, 172], k=10)
            assert (fallback.history_source, fallback.history_length) == (HISTORY_FROM_REQUEST, 2)
            np.testing.assert_array_equal(fallback.item_ids, client.recommend([50, 172], k=10).item_ids)
            with pytest.raises(SessionStoreError, match="session store"):
                client.recommend_session("shopper-1", k=10)
    finally:
        embedded_store.start(store_dir)
    with RecommenderClient(server.grpc_url) as client:  # back: the store's events as before the outage
        assert client.recommend_session("shopper-1", k=10).history_length == 5


def test_a_session_layout_without_a_store_is_refused(tiny_export, tmp_path):
    with pytest.raises(ServingError, match="needs a session store"):
        write_repository(tiny_export, tmp_path / "repo", ("session",), RepositorySettings())
    leaky = tmp_path / "store.json"
    leaky.write_text(json.dumps({"url": "redis://127.0.0.1:6379/0", "password": "secret"}))
    with pytest.raises(ServingError, match="holds a password"):
        write_repository(tiny_export, tmp_path / "repo", ("session",), RepositorySettings(session_store=str(leaky)))
