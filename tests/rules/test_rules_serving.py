"""Business rules on a real Triton with a real store (recserve's embedded Valkey server): the item attributes
come from `recserve data --items`, rules are stored with the repository by name or written out in requests,
items are excluded or kept to per request and hidden catalogue-wide through the store. In the fused and the
session layouts and in their native twins on recserve's backend (which take rules stored by name, not
written out): an answer under a rule is the model's own top items among those the rule lets through (so a
hidden or excluded item never appears), a hide is honoured by the next answer, no rule answers as before, and
a bad rule fails its own request only, naming what to write."""

import asyncio
import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from recserve.artifacts.item_table import read_attributes
from recserve.cli.main import app
from recserve.client import AsyncRecommenderClient, RecommenderClient, RecommendError, Rules
from recserve.constants import FUSED_MODEL, ITEMS_FILE, NATIVE_MODEL, NATIVE_SESSION_MODEL, SESSION_MODEL
from recserve.errors import ServingError
from recserve.rules.language import compile_rule
from recserve.serving.triton_repository.layouts import write_repository
from recserve.serving.triton_repository.repository_settings import RepositorySettings
from recserve.serving.triton_server.launcher import TritonServer
from recserve.sessions import embedded_store
from recserve.sessions.session_store import SessionStore
from tests.conftest import model_top_ids, server_settings

NAMED = {"cheap_games": 'category == "games" and price < 50', "grown_up": "adult"}
HISTORIES = [np.array([1, 2, 3]), np.array([50, 172, 181, 258, 300]), np.array([7])]
BY_ITEMS = (FUSED_MODEL, NATIVE_MODEL)  # the python model and its native twin on recserve's backend
BY_SESSION = (SESSION_MODEL, NATIVE_SESSION_MODEL)


@pytest.fixture(scope="session")
def shop_items(tmp_path_factory):
    """The shop's item table for ML-100K's 1,682 items: a category, a price and an adult flag each (and two
    rows for items the catalogue does not hold)."""
    ids = np.arange(1, 1683)
    table = pl.DataFrame(
        {
            "item_id": np.concatenate([ids, [99991, 99992]]),
            "category": [("games", "books", "toys")[i % 3] for i in range(len(ids) + 2)],
            "price": np.concatenate([(ids * 7) % 100, [1, 1]]).astype(float),
            "adult": np.concatenate([ids % 7 == 0, [False, False]]),
        }
    )
    path = tmp_path_factory.mktemp("shop") / "items.csv"
    table.write_csv(path)
    return path


@pytest.fixture(scope="session")
def shop_run(tiny_run, shop_items, tmp_path_factory):
    """``tiny_run`` beside the item table `recserve data --items` prepares from the same log (the catalogue is the
    same: the attributes are all that differ)."""
    data = tmp_path_factory.mktemp("shop-data") / "data"
    result = CliRunner().invoke(app, ["data", "ml-100k", "--out", str(data), "--items", str(shop_items)])
    assert result.exit_code == 0, result.output
    described = json.loads((data / "dataset.json").read_text())["attributes"]
    kinds = {"year": "number", "genre": "string", "category": "string", "price": "number", "adult": "bool"}
    assert described["kinds"] == kinds  # ML-100K's own two, then the shop's
    assert described["items_described"] == 1682 and described["rows_for_no_catalogue_item"] == 2
    run = tmp_path_factory.mktemp("shop-run") / "run"
    shutil.copytree(tiny_run, run)
    shutil.copyfile(data / ITEMS_FILE, run / ITEMS_FILE)
    return run


@pytest.fixture(scope="module")
def shop(shop_run, tmp_path_factory):
    """A repository of the fused, session, native and native session layouts (the native ones on recserve's
    backend) over a TorchScript export of ``shop_run``, with named rules and a store, served by a real
    Triton."""
    from recserve.export.exporter import export_run

    root = tmp_path_factory.mktemp("shop-serving")
    export = root / "export"
    export_run(shop_run, "torchscript", "fp32", export)
    store = root / "store"
    embedded_store.start(store)
    rules = root / "rules.toml"
    rules.write_text("".join(f"{name} = '{text}'\n" for name, text in NAMED.items()))
    settings = RepositorySettings(
        max_queue_delay_microseconds=2000, session_store=str(store), rules=str(rules), native_runtime="recserve"
    )
    write_repository(export, root / "repo", ("fused", "session", "native", "native_session"), settings)
    try:
        with TritonServer(root / "repo", server_settings()) as server:
            server.repo = root / "repo"
            yield server, store, read_attributes(export, 1682)
    finally:
        embedded_store.stop(store)


def _without(mask: np.ndarray, ids: list[int]) -> np.ndarray:
    out = mask.copy()
    out[np.asarray(ids) - 1] = False  # ML-100K's IDs are 1..1682 in catalogue order
    return out


def _ids_of(mask: np.ndarray) -> set[int]:
    return set((np.flatnonzero(mask) + 1).tolist())  # ML-100K's IDs are 1..1682 in catalogue order


def _agree(got: np.ndarray, want: np.ndarray, clear: bool) -> None:
    want = want[want >= 0]
    if clear:
        np.testing.assert_array_equal(got, want)
    else:  # a near-tie at the last place may swap it
        assert len(got) == len(want) and set(got[:-1]) <= set(want)


def _store(store_dir) -> SessionStore:
    """The store as its catalogue operator reaches it (``recserve items``): the only user that may hide."""
    return SessionStore(embedded_store.role_settings(store_dir, "operator"), "int64")


def _upkeep(store_dir) -> SessionStore:
    """The store as its upkeep user reaches it: every command, to change it behind the models' backs."""
    return SessionStore(embedded_store.admin_settings(store_dir))


@pytest.mark.parametrize("model", BY_ITEMS)
def test_no_rule_answers_as_before_and_each_rule_is_the_models_top_among_what_it_lets_through(shop, shop_run, model):
    server, _, attributes = shop
    cases = [
        (Rules(rule="cheap_games"), compile_rule(NAMED["cheap_games"], attributes)),
        (Rules(rule="grown_up", exclude=[7, 14]), _without(compile_rule(NAMED["grown_up"], attributes), [7, 14])),
    ]
    if model == FUSED_MODEL:  # rules written out: the python layouts only
        cases += [
            (
                Rules(where='category == "toys" and price >= 50'),
                compile_rule('category == "toys" and price >= 50', attributes),
            ),
            (Rules(rule="grown_up", where="price < 30"), compile_rule("adult and price < 30", attributes)),
        ]
    with RecommenderClient(server.grpc_url, model=model) as client:
        for history in HISTORIES:
            want, clear = model_top_ids(shop_run, [history])
            _agree(client.recommend(history, k=10).item_ids, want[0], clear[0])
            for rules, allowed in cases:
                got = client.recommend(history, k=10, rules=rules).item_ids
                assert set(got.tolist()) <= _ids_of(allowed)
                want, clear = model_top_ids(shop_run, [history], allowed=allowed)
                _agree(got, want[0], clear[0])


@pytest.mark.parametrize("model", BY_ITEMS)
def test_excluded_items_never_appear_and_a_list_to_keep_to_is_all_an_answer_holds(shop, model):
    server, _, _ = shop
    with RecommenderClient(server.grpc_url, model=model) as client:
        first = client.recommend(HISTORIES[1], k=10).item_ids
        excluded = first[:4].tolist() + [99991]  # an ID the catalogue does not hold excludes nothing more
        got = client.recommend(HISTORIES[1], k=10, rules=Rules(exclude=excluded)).item_ids
        assert not set(got.tolist()) & set(excluded) and len(got) == 10
        np.testing.assert_array_equal(got[:6], first[4:])
        kept = client.recommend(HISTORIES[1], k=10, rules=Rules(include=[5, 6, 7, 99991])).item_ids
        assert sorted(kept.tolist()) == [5, 6, 7]  # fewer than k pass: those, and the answer says so by its length
        none = client.recommend(HISTORIES[1], k=10, rules=Rules(include=[99991])).item_ids
        assert len(none) == 0  # a list of items the catalogue lacks lets nothing through, never everything


@pytest.mark.parametrize("model", BY_ITEMS)
def test_each_request_of_a_batch_keeps_out_its_own_excluded_items_and_no_neighbours(shop, model):
    """Eight requests at once, one batch, the same history, each excluding another one of the top items (and
    each a list of another length): every answer lacks its own and holds its neighbours'. A row's list shifted
    onto the next row (in the python rule book or recserve's backend) fails this."""
    server, _, _ = shop
    with RecommenderClient(server.grpc_url, model=model) as client:
        top = client.recommend(HISTORIES[1], k=20).item_ids.tolist()
    lists = [[top[n]] + [99990 - m for m in range(n)] for n in range(8)]  # IDs the catalogue lacks pad some

    async def batch():
        client = AsyncRecommenderClient(server.grpc_url, model=model)
        try:
            return await asyncio.gather(*(client.recommend(HISTORIES[1], k=12, rules=Rules(exclude=x)) for x in lists))
        finally:
            await client.close()

    for n, answer in enumerate(asyncio.run(batch())):
        got = answer.item_ids.tolist()
        assert top[n] not in got, (n, got)
        assert all(top[m] in got for m in range(8) if m != n), (n, got)


@pytest.mark.parametrize(("model", "session_model"), zip(BY_ITEMS, BY_SESSION))
def test_a_hidden_item_leaves_the_next_answer_of_every_layout_and_comes_back_when_shown(shop, model, session_model):
    server, store_dir, _ = shop
    with RecommenderClient(server.grpc_url, model=model) as client, _store(store_dir) as store:
        before = client.recommend(HISTORIES[0], k=10).item_ids
        session = f"hider-{session_model}"
        by_session = client.recommend_session(session, HISTORIES[0].tolist(), k=10, model=session_model).item_ids
        # beside two of the answers' items, 30,000 IDs the catalogue lacks: a set longer than any session
        # (a tenth of a large catalogue), which the native layouts read whole
        hidden = [int(before[0]), int(by_session[1]), *range(500_000, 530_000)]
        assert store.hide([str(x) for x in hidden]).changed == len(hidden)
        try:
            after = client.recommend(HISTORIES[0], k=10).item_ids  # the next answer: the hide was acknowledged
            assert not set(after.tolist()) & set(hidden) and len(after) == 10
            again = client.recommend_session(session, k=10, model=session_model).item_ids
            assert not set(again.tolist()) & set(hidden)
        finally:
            store.hide([str(x) for x in hidden], hidden=False)
        np.testing.assert_array_equal(client.recommend(HISTORIES[0], k=10).item_ids, before)
        shown = client.recommend_session(session, k=10, model=session_model).item_ids
        np.testing.assert_array_equal(shown, by_session)


def test_the_session_layout_keeps_to_a_requests_rules(shop, shop_run):
    server, _, attributes = shop
    allowed = compile_rule('category != "books"', attributes)
    with RecommenderClient(server.grpc_url) as client:
        answer = client.recommend_session(
            "ruled", HISTORIES[1].tolist(), k=10, rules=Rules(where='category != "books"')
        )
    assert answer.history_length == len(HISTORIES[1])
    want, clear = model_top_ids(shop_run, [HISTORIES[1]], allowed=allowed)
    _agree(answer.item_ids, want[0], clear[0])


def test_the_native_session_layout_keeps_to_a_stored_rule_and_refuses_one_written_out(shop, shop_run):
    server, _, attributes = shop
    allowed = _without(compile_rule(NAMED["cheap_games"], attributes), [1])
    with RecommenderClient(server.grpc_url) as client:
        answer = client.recommend_session(
            "native-ruled",
            HISTORIES[1].tolist(),
            k=10,
            model=NATIVE_SESSION_MODEL,
            rules=Rules(rule="cheap_games", exclude=[1]),
        )
        with pytest.raises(RecommendError, match="rules stored by name, not written out: store it with recserve repo"):
            client.recommend_session("native-ruled", k=10, model=NATIVE_SESSION_MODEL, rules=Rules(where="adult"))
    assert answer.history_length == len(HISTORIES[1])
    want, clear = model_top_ids(shop_run, [HISTORIES[1]], allowed=allowed)
    _agree(answer.item_ids, want[0], clear[0])


@pytest.mark.parametrize(
    ("model", "rules", "message"),
    [
        (FUSED_MODEL, Rules(where="brand == 1"), "no attribute 'brand'; the item table has year (number), genre"),
        (FUSED_MODEL, Rules(where='price == "cheap"'), "price is a number attribute"),
        (FUSED_MODEL, Rules(where="category = 1"), "compare with ==, not ="),
        (FUSED_MODEL, Rules(where="year < 1" + "0" * 400), "past int64's range"),  # an OverflowError once
        (FUSED_MODEL, Rules(where="price > 1e400"), "not a finite number"),
        (FUSED_MODEL, Rules(rule="nope"), "no rule named 'nope'; the repository stores cheap_games, grown_up"),
        (FUSED_MODEL, Rules(exclude=list(range(2000))), "exclude_item_ids: 2000 items; at most 1024"),
        (NATIVE_MODEL, Rules(rule="nope"), "no rule named 'nope'; the repository stores cheap_games, grown_up"),
        (NATIVE_MODEL, Rules(include=list(range(2000))), "include_item_ids: 2000 items; at most 1024"),
        (NATIVE_MODEL, Rules(where="adult"), "the native layout takes rules stored by name, not written out"),
    ],
)
def test_a_bad_rule_fails_its_own_request_naming_the_fix_and_leaves_the_batch_alone(shop, model, rules, message):
    server, _, _ = shop

    async def batch():
        client = AsyncRecommenderClient(server.grpc_url, model=model)
        try:
            return await asyncio.gather(
                *(client.recommend(HISTORIES[0], k=10) for _ in range(4)),
                client.recommend(HISTORIES[0], k=10, rules=rules),
                *(client.recommend(HISTORIES[0], k=10) for _ in range(4)),
                return_exceptions=True,
            )
        finally:
            await client.close()

    answers = asyncio.run(batch())
    assert isinstance(answers[4], RecommendError) and message in str(answers[4])
    if "written out" not in message:  # that one the client refuses before sending
        assert answers[4].status in ("400", "StatusCode.INVALID_ARGUMENT")
    assert all(len(a.item_ids) == 10 for i, a in enumerate(answers) if i != 4)


@pytest.mark.parametrize("model", [FUSED_MODEL, SESSION_MODEL])
def test_a_rule_past_its_numbers_type_or_a_huge_append_fails_its_request_alone_in_a_batch_of_thirty(shop, model):
    """Thirty requests at once (one batch, or a few), two of them bad: a rule whose number is past int64 (once
    an OverflowError that failed every request batched with it) and a million items to append (once 18 s of
    one instance's time). Each bad one gets its own error in one line; the 28 others their answers."""
    server, _, _ = shop
    bad = {7: ("rule", "year < 1" + "0" * 400), 19: ("append", 1_000_000)}

    def ask(n: int):
        with RecommenderClient(server.grpc_url, model=model) as client:
            what, value = bad.get(n, (None, None))
            rules = Rules(where=value) if what == "rule" else None
            items = np.arange(1, value + 1) % 1682 + 1 if what == "append" else HISTORIES[1]
            try:
                if model == SESSION_MODEL:
                    return client.recommend_session(f"batch-{n}", items.tolist(), k=10, rules=rules)
                return client.recommend(items, k=10, rules=rules)
            except RecommendError as err:
                return err

    with ThreadPoolExecutor(30) as pool:
        answers = list(pool.map(ask, range(30)))
    assert "past int64's range" in str(answers[7]) and "Traceback" not in str(answers[7])
    assert "1000000 items a row; at most 4096" in str(answers[19])
    assert all(
        isinstance(a, RecommendError) and a.status in ("400", "StatusCode.INVALID_ARGUMENT")
        for a in (answers[7], answers[19])
    )
    assert all(len(a.item_ids) == 10 for n, a in enumerate(answers) if n not in bad), answers


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.sets(st.sampled_from(["games", "books", "toys"]), min_size=1),
    st.integers(min_value=0, max_value=100),
    st.lists(st.integers(min_value=1, max_value=1682), max_size=30),
    st.lists(st.integers(min_value=1, max_value=1682), max_size=30),
    st.sampled_from([0, 1, 2]),
    st.booleans(),
    st.sampled_from([None, *NAMED]),
    st.booleans(),
)
def test_no_answer_ever_holds_an_item_its_rules_keep_out(
    shop, categories, bound, excluded, hidden, history, by_session, stored, native
):
    """A property over random rules, exclusions and hidden items, in every layout: the python ones with a
    rule written out, the native ones with a stored rule (or none)."""
    server, store_dir, attributes = shop
    where = f"category in ({', '.join(json.dumps(c) for c in sorted(categories))}) and price < {bound}"
    rules = Rules(rule=stored, exclude=excluded) if native else Rules(where=where, exclude=excluded)
    if native:
        mask = compile_rule(NAMED[stored], attributes) if stored else np.ones(1682, dtype=bool)
    else:
        mask = compile_rule(where, attributes)
    allowed = _ids_of(mask) - set(excluded) - set(hidden)
    model = (BY_SESSION if by_session else BY_ITEMS)[native]
    with RecommenderClient(server.grpc_url, model=model) as client, _store(store_dir) as store:
        store.hide([str(x) for x in hidden])
        try:
            if by_session:
                session = f"p{history}-{model}"
                got = client.recommend_session(session, HISTORIES[history].tolist(), k=20, rules=rules, model=model)
            else:
                got = client.recommend(HISTORIES[history], k=20, rules=rules)
        finally:
            store.hide([str(x) for x in hidden], hidden=False)
    assert set(got.item_ids.tolist()) <= allowed
    assert len(got.item_ids) == min(20, len(allowed - set(HISTORIES[history].tolist())))


@pytest.fixture(scope="module")
def one_instance(shop):
    """The shop's export served again with one instance a model, so that the instance a test's requests reach
    is the one that read before (each instance reads the hidden items for itself)."""
    server, store_dir, _ = shop
    repo = server.repo.parent / "repo-one-instance"
    settings = RepositorySettings(session_store=str(store_dir), native_runtime="recserve", native_instance_count=1)
    write_repository(server.repo.parent / "export", repo, ("fused", "native"), settings)
    with TritonServer(repo, server_settings()) as one:
        yield one, store_dir


@pytest.mark.parametrize("model", BY_ITEMS)
def test_a_model_reads_what_changed_since_its_last_read_and_the_whole_set_only_past_the_kept_changes(
    one_instance, model
):
    """After its first read a model reads the hides since the change it holds, not the whole set again: with the
    set's key removed behind its back (the changes kept), an item hidden before stays hidden. A model further
    behind than the stream keeps, whose version moved without the changes' entries, or after a change too large
    to keep as items, reads the whole set."""
    from recserve.sessions import store_contract

    server, store_dir = one_instance
    with (
        RecommenderClient(server.grpc_url, model=model) as client,
        _store(store_dir) as store,
        _upkeep(store_dir) as upkeep,
    ):
        top = client.recommend(HISTORIES[1], k=3).item_ids.tolist()
        first, second = top[0], top[1]
        store.hide([str(first)])
        try:
            assert first not in client.recommend(HISTORIES[1], k=3).item_ids.tolist()  # read: the model holds it
            set_key = store_contract.HIDDEN_KEY.format(prefix=store.settings.prefix)
            upkeep._client.delete(set_key)  # the set gone, its changes kept: a whole read would show `first`
            store.hide([str(second)])
            got = client.recommend(HISTORIES[1], k=3).item_ids.tolist()
            assert first not in got and second not in got, got  # the change alone was read
            kept = store_contract.HIDDEN_CHANGES_KEPT
            for n in range(kept // 2 + 1):  # more changes than the stream keeps, each a hide and a show
                store.hide([str(99990 - n)])
                store.hide([str(99990 - n)], hidden=False)
            # past the kept changes: the whole set, which holds `second` alone (the removed key lost `first`)
            got = client.recommend(HISTORIES[1], k=3).item_ids.tolist()
            assert first in got and second not in got, got
            # a writer that changes the set and its version but writes no entry (a recserve before the stream):
            # the version moved by more than the changes read, so the whole set is read
            version_key = store_contract.HIDDEN_VERSION_KEY.format(prefix=store.settings.prefix)
            third = got[1] if got[0] == first else got[0]
            upkeep._client.sadd(set_key, str(third))
            upkeep._client.incr(version_key)
            got = client.recommend(HISTORIES[1], k=3).item_ids.tolist()
            assert third not in got and second not in got, got
            upkeep._client.srem(set_key, str(third))
            upkeep._client.incr(version_key)
            # a change too large to keep as items: one entry that says so, and the whole set read
            many = [str(third)] + [str(10**12 + n) for n in range(store_contract.HIDDEN_CHANGE_MAX_ITEMS)]
            store.hide(many)
            changes_key = store_contract.HIDDEN_CHANGES_KEY.format(prefix=store.settings.prefix)
            ((_, fields),) = store._client.xrevrange(changes_key, count=1)
            assert fields == {store_contract.WHOLE_SET_ITEM: store_contract.WHOLE_SET}
            got = client.recommend(HISTORIES[1], k=3).item_ids.tolist()
            assert third not in got and second not in got, got
            store.hide(many, hidden=False)
            assert third in client.recommend(HISTORIES[1], k=10).item_ids.tolist()
        finally:
            store.hide([str(first), str(second)], hidden=False)
        assert client.recommend(HISTORIES[1], k=3).item_ids.tolist() == top


@pytest.mark.parametrize("model", BY_ITEMS)
def test_a_version_that_goes_back_or_is_gone_makes_every_reader_read_the_whole_set(one_instance, model):
    """Once a deleted version left recserve's backend never reading the set again (a hidden item shown 8 of 8
    times). Every reader now reads the whole set where the version went back, and at most a second apart while
    there is none (each a warning in the server's log)."""
    import time

    from recserve.sessions import store_contract

    server, store_dir = one_instance
    with (
        RecommenderClient(server.grpc_url, model=model) as client,
        _store(store_dir) as store,
        _upkeep(store_dir) as upkeep,
    ):
        prefix = store.settings.prefix
        set_key, version_key = (
            k.format(prefix=prefix) for k in (store_contract.HIDDEN_KEY, store_contract.HIDDEN_VERSION_KEY)
        )
        top = client.recommend(HISTORIES[1], k=3).item_ids.tolist()
        store.hide([str(top[0])])
        try:
            assert top[0] not in client.recommend(HISTORIES[1], k=3).item_ids.tolist()
            version = store.hidden_version()
            upkeep._client.set(version_key, version - 1)  # back by one, the set changed behind it
            upkeep._client.sadd(set_key, str(top[1]))
            got = client.recommend(HISTORIES[1], k=3).item_ids.tolist()
            assert top[0] not in got and top[1] not in got, got
            upkeep._client.delete(version_key)  # gone: then a change with no version at all
            upkeep._client.sadd(set_key, str(top[2]))
            deadline, got = time.monotonic() + 5, top
            while top[2] in got and time.monotonic() < deadline:
                got = client.recommend(HISTORIES[1], k=3).item_ids.tolist()
                time.sleep(0.1)
            assert top[2] not in got and top[0] not in got, got  # read within about a second
        finally:
            upkeep._client.srem(set_key, *(str(t) for t in top))
            upkeep._client.set(version_key, 10**6)
            store.hide([str(t) for t in top], hidden=False)
        assert client.recommend(HISTORIES[1], k=3).item_ids.tolist() == top


def test_a_store_gone_down_keeps_the_items_hidden_last_and_every_request_answered(shop, tmp_path):
    """recserve's backend by item IDs asks for the hidden items' version before its graph runs and reads the
    reply after. With its store stopped (the ask, or the connection, failing), every request is still answered and
    the item hidden last stays hidden; the log says so, not once a batch. The store back, a show is read again."""
    import time

    server, _, _ = shop
    store_dir, repo, log = tmp_path / "store", tmp_path / "repo", tmp_path / "server.log"
    embedded_store.start(store_dir)
    settings = RepositorySettings(session_store=str(store_dir), native_runtime="recserve", native_instance_count=1)
    write_repository(server.repo.parent / "export", repo, ("native",), settings)
    try:
        with (
            TritonServer(repo, server_settings(), log_path=log) as alone,
            RecommenderClient(alone.grpc_url, model=NATIVE_MODEL) as client,
        ):
            top = client.recommend(HISTORIES[1], k=3).item_ids.tolist()
            with _store(store_dir) as store:
                store.hide([str(top[0])])
            assert top[0] not in client.recommend(HISTORIES[1], k=3).item_ids.tolist()
            embedded_store.stop(store_dir)
            for _ in range(30):
                got = client.recommend(HISTORIES[1], k=3).item_ids.tolist()
                assert top[0] not in got and len(got) == 3, got
            embedded_store.start(store_dir)  # the same folder: its port, password and hidden items kept
            with _store(store_dir) as store:
                store.hide([str(top[0])], hidden=False)
            deadline = time.monotonic() + 10
            while got != top and time.monotonic() < deadline:
                time.sleep(0.1)
                got = client.recommend(HISTORIES[1], k=3).item_ids.tolist()
            assert got == top
        said = log.read_text(errors="replace").count("the hidden items were not read")
        assert 1 <= said <= 3, said  # a line a problem, not one a batch
    finally:
        embedded_store.stop(store_dir)


def test_rules_from_the_command_line_and_a_hide_there_show_in_the_next_answer(shop):
    server, store_dir, _ = shop
    runner = CliRunner()
    ask = ["recommend", "1", "2", "3", "--url", server.grpc_url, "--json", "--k", "5"]
    result = runner.invoke(app, [*ask, "--where", 'category == "games"', "--exclude", "4,13"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert len(answer["item_id"]) == 5 and all(i % 3 == 1 and i not in (4, 13) for i in answer["item_id"])
    top = answer["item_id"][0]
    hidden = runner.invoke(app, ["items", "hide", str(top), "--store", str(store_dir)])
    assert hidden.exit_code == 0 and "1 item(s) hidden (version" in hidden.output, hidden.output
    assert "1 changed the set" in hidden.output
    try:
        again = json.loads(runner.invoke(app, [*ask, "--where", 'category == "games"']).output)
        assert top not in again["item_id"]
        listed = json.loads(runner.invoke(app, ["items", "list", "--store", str(store_dir), "--json"]).output)
        assert listed["hidden"] == [str(top)]
    finally:
        runner.invoke(app, ["items", "show", str(top), "--store", str(store_dir)])
    typo = runner.invoke(
        app, [*ask, "--where", 'category == "game"', "--items", str(server.repo.parent / "export" / ITEMS_FILE)]
    )
    said = " ".join(typo.output.split())
    assert typo.exit_code == 0 and "no item's category is 'game'; the closest it holds: 'games'" in said, said
    few = runner.invoke(app, [*ask[:-2], "--include", "5,6"])
    assert few.exit_code == 0 and "the rules let 2 of the 10 items asked for through" in few.output, few.output
    bad = runner.invoke(app, [*ask, "--where", "brand == 1"])
    assert bad.exit_code == 1 and "no attribute 'brand'" in bad.output and "Traceback" not in bad.output


def test_items_hide_checks_ids_against_the_catalogue_and_a_change_run_again_by_its_id_changes_nothing(shop):
    """`items hide 0289 410.0 ' 498' abc` once said "4 of 4 hidden" and hid nothing: against the catalogue each
    is refused by name and nothing changes; an ID the catalogue lacks is hidden and named as unknown; a change
    run again with its ID (a script's retry) moves the version once."""
    server, store_dir, _ = shop
    runner = CliRunner()
    catalogue = ["--store", str(store_dir), "--catalogue", str(server.repo)]
    with _store(store_dir) as store:
        before = store.hidden_version()
        bad = runner.invoke(app, ["items", "hide", "0289", "410.0", " 498", "abc", *catalogue], env={"COLUMNS": "300"})
        assert bad.exit_code != 0 and "'0289', '410.0', ' 498', 'abc': not item IDs of this catalogue" in bad.output
        assert store.hidden_version() == before and store.hidden()[1] == []
        hide = ["items", "hide", "12", "99999999", *catalogue, "--change-id", "restock-7"]
        first, again = runner.invoke(app, hide), runner.invoke(app, hide)
        said, said_again = " ".join(first.output.split()), " ".join(again.output.split())
        assert first.exit_code == 0 and "2 changed the set" in said, said
        assert "1 not in the catalogue (99999999)" in said
        assert again.exit_code == 0 and "0 changed the set, 2 were this change's ID applied before" in said_again
        assert store.hidden_version() == (before or 0) + 1 and store.hidden()[1] == ["12", "99999999"]
        shown = runner.invoke(app, ["items", "show", "12", "99999999", *catalogue])
        assert shown.exit_code == 0 and store.hidden()[1] == [], shown.output


def test_a_stored_rule_that_does_not_fit_the_export_is_refused_before_anything_is_written(shop_run, tmp_path):
    from recserve.export.exporter import export_run

    export = tmp_path / "export"
    export_run(shop_run, "eager", "fp32", export)
    rules = tmp_path / "rules.toml"
    rules.write_text("acme = 'brand == \"acme\"'\n")
    with pytest.raises(ServingError, match="rule 'acme'.*no attribute 'brand'"):
        write_repository(export, tmp_path / "repo", ("fused",), RepositorySettings(rules=str(rules)))
    assert not (tmp_path / "repo").exists()


def test_a_stored_rule_with_a_value_no_item_holds_is_written_and_said(shop_run, tmp_path, caplog):
    """`category == "game"` where the items hold "games": stored (a value may come with a later catalogue),
    and the log names the closest values, so an empty carousel is never a silent surprise."""
    from recserve.export.exporter import export_run

    export_run(shop_run, "eager", "fp32", tmp_path / "export")
    rules = tmp_path / "rules.toml"
    rules.write_text("typo = 'category == \"game\"'\n")
    with caplog.at_level("WARNING"):
        write_repository(tmp_path / "export", tmp_path / "repo", ("fused",), RepositorySettings(rules=str(rules)))
    assert "rule 'typo'" in caplog.text and "no item's category is 'game'; the closest it holds: 'games'" in caplog.text


def test_a_load_test_under_each_rule_variant_runs_beside_none_and_says_what_each_costs(shop, ml100k_dir, tmp_path):
    """`recserve bench --rules`: the fused and native layouts under a stored rule, 20 excluded items a request
    and a tenth of the catalogue hidden, each level beside no rule; every request answered, the hidden items
    shown again after their runs, and no answer after a hidden run showed one."""
    from recserve.bench.load_settings import LoadSettings
    from recserve.bench.perf_analyzer import LoadLevel
    from recserve.bench.sweep import real_histories, sweep

    server, store_dir, _ = shop
    histories, string_ids = real_histories(ml100k_dir)
    rules = "rule:cheap_games,exclude:20,hidden:10"
    result = sweep(
        ["fused", "native"],
        [LoadLevel("concurrency", 2)],
        tmp_path,
        histories,
        string_ids,
        repo=server.repo,
        load=LoadSettings(measurement_ms=300, slo_p99_ms=1000, client_threads=1, rules=rules),
    )
    rows = result["results"]
    assert sorted((r["layout"], r.get("rules", "none")) for r in rows) == sorted(
        (layout, variant) for layout in ("fused", "native") for variant in ("none", *rules.split(","))
    )
    assert all(r["errors"] == 0 and r["throughput_rps"] > 0 for r in rows), rows
    assert next(r for r in rows if r.get("rules") == "hidden:10")["hidden_items"] == 168
    overhead = result["rule_overhead"]
    assert set(overhead) == {"fused", "native"} and set(overhead["native"]) == set(rules.split(","))
    assert set(overhead["native"]["exclude:20"]["levels"]) == {"concurrency=2"}
    for layout in ("fused", "native"):  # answers after each hidden run were checked, and none showed one
        assert overhead[layout]["hidden:10"]["answers_probed"] == 50
        assert overhead[layout]["hidden:10"]["answers_showing_hidden"] == 0
    assert "0 of 50 answers after it showed a hidden item" in (tmp_path / "report.md").read_text()
    assert "## Business rules beside none" in (tmp_path / "report.md").read_text()
    with _store(store_dir) as store:
        assert store.hidden()[1] == []  # shown again after the hidden variant's runs
    with pytest.raises(ServingError, match="--rules 'hidden:200': expected none, rule:NAME, exclude:N"):
        load = LoadSettings(rules="hidden:200")
        sweep(["fused"], [LoadLevel("concurrency", 1)], tmp_path, histories, repo=server.repo, load=load)


def _integration_blocks() -> list[str]:
    """docs/integration.md's blocks that this file runs, each as one shell script."""
    from tests.test_docs import shell_blocks

    marker = "<!-- run by tests/rules/test_rules_serving.py -->"
    return ["\n".join(cmds) for where, before, cmds in shell_blocks() if before == marker and "integration" in where]


def test_docs_integrations_curl_and_redis_cli_blocks_answer_as_they_say(shop):
    """Each block a Java or Go team would copy, run as written against the real server and store (their ports
    and folder put in): JSON answers of what the rules let through, a session that took its items, a hide and an
    event written as the contract says, and honoured by the next answers."""
    import subprocess

    server, store_dir, attributes = shop
    port = embedded_store.settings_of(store_dir).url.rsplit(":", 1)[1].split("/")[0]
    blocks = _integration_blocks()
    assert len(blocks) == 6, blocks
    outputs = []
    try:
        for block in blocks:
            script = block.replace("127.0.0.1:8000", server.http_url).replace("-p 6379", f"-p {port}")
            script = script.replace("STORE/", f"{store_dir}/")
            run = subprocess.run(["bash", "-c", "set -eo pipefail\n" + script], capture_output=True, text=True)
            if run.returncode != 0:  # the block fails the test, with what the server said
                said = subprocess.run(
                    ["bash", "-c", script.replace("curl -sf", "curl -s")], capture_output=True, text=True
                )
                raise AssertionError(f"{block}\n{said.stdout}\n{run.stderr}")
            outputs.append(run.stdout)
        answers = [json.loads(line) for out in outputs[:3] for line in out.replace("}{", "}\n{").splitlines() if line]
        ids = [next(o["data"] for o in a["outputs"] if o["name"] == "item_ids") for a in answers]
        assert len(ids[0]) == 5 and ids[0] == model_top_ids_of(server, [1, 2, 3], 5)
        allowed = _ids_of(compile_rule('category == "games" and price < 50', attributes)) - {4, 13}
        assert len(ids[1]) == 5 and set(ids[1]) <= allowed
        assert len(ids[2]) == 5 and set(ids[2]) <= _ids_of(compile_rule(NAMED["cheap_games"], attributes))
        session = next(o["data"] for o in answers[3]["outputs"] if o["name"] == "history_length")
        assert session == [2] and len(ids[3]) == 5  # the two items appended, then answered from the store
        stored = json.loads(outputs[3])["outputs"]
        assert stored == [{"name": "stored", "datatype": "INT32", "shape": [1, 1], "data": [1]}]
        with RecommenderClient(server.grpc_url) as client:  # the hide written by hand is honoured
            assert 313 not in client.recommend([300, 313], k=50).item_ids.tolist()
            after = client.recommend_session("shopper-42", k=5)
            assert after.history_length == 3  # the writer's event appended to the same session
    finally:
        with _store(store_dir) as store:
            store.hide(["313"], hidden=False)


def test_docs_grpcurl_blocks_answer_over_grpc_as_they_say(shop, tmp_path):
    """The gRPC blocks of docs/integration.md, run as written with grpcurl (a test tool of the suite's) and
    recserve's protoset against the real server: the top 5 of the items by HTTP decoded from Triton's raw
    output, a session on recserve's backend that took its two items, and an event alone stored."""
    import base64
    import os
    import subprocess
    import sys

    from tests.test_docs import shell_blocks

    server, _, _ = shop
    marker = "<!-- run by tests/rules/test_rules_serving.py over gRPC -->"
    blocks = ["\n".join(c) for where, before, c in shell_blocks() if before == marker and "integration" in where]
    assert len(blocks) == 2, blocks
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # the suite's grpcurl and python
    answers = []
    for block in blocks:
        script = block.replace("127.0.0.1:8001", server.grpc_url)
        run = subprocess.run(
            ["bash", "-c", "set -eo pipefail\n" + script],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=os.environ | {"PATH": path},
        )
        assert run.returncode == 0, f"{block}\n{run.stdout}\n{run.stderr}"
        text, decoder = run.stdout[run.stdout.index("{") :], json.JSONDecoder()
        while text.strip():
            answer, end = decoder.raw_decode(text)
            answers.append(answer)
            text = text[end:].lstrip()

    def output(answer: dict, name: str) -> np.ndarray:
        n = [o["name"] for o in answer["outputs"]].index(name)
        kind = {"INT64": np.int64, "INT32": np.int32, "FP32": np.float32}[answer["outputs"][n]["datatype"]]
        return np.frombuffer(base64.b64decode(answer["raw_output_contents"][n]), dtype=np.dtype(kind).newbyteorder("<"))

    by_items, by_session, event = answers
    assert output(by_items, "item_ids").tolist() == model_top_ids_of(server, [1, 2, 3], 5)
    assert output(by_session, "history_length").tolist() == [2] and len(output(by_session, "item_ids")) >= 5
    assert output(event, "stored").tolist() == [1]
    with RecommenderClient(server.grpc_url) as client:  # the event appended to the same session, once
        assert client.recommend_session("shopper-9", k=5).history_length == 3


def model_top_ids_of(server, history: list[int], k: int) -> list[int]:
    with RecommenderClient(server.grpc_url) as client:
        return client.recommend(history, k=k).item_ids.tolist()


@pytest.mark.parametrize("model", [SESSION_MODEL, NATIVE_SESSION_MODEL])
def test_items_appended_with_the_clients_event_ids_are_stored_once_when_the_request_is_sent_again(shop, model):
    """Once the session models took no event ID, so a client's retry stored its click twice. With the client's
    IDs the request sent again changes nothing, in the python model and on recserve's backend alike; a bad ID
    or shape fails its own request in one line."""
    server, _, _ = shop
    session = f"evt-shopper-{model}"
    with RecommenderClient(server.grpc_url) as client:
        first = client.recommend_session(session, [50, 172], k=5, model=model, event_ids=["click-1", "click-2"])
        again = client.recommend_session(session, [50, 172], k=5, model=model, event_ids=["click-1", "click-2"])
        assert first.history_length == again.history_length == 2  # the retry stored nothing twice
        mixed = client.recommend_session(session, [181, 258], k=5, model=model, event_ids=["click-3", ""])
        assert mixed.history_length == 4  # an item without the client's ID gets one of recserve's
        for ids, message in (
            (["has space", "x"], "event_ids: 1 to 64 letters, digits or '._:-'"),
            (["only-one"], "event_ids: BYTES of item_ids' shape [1, 2]"),
        ):
            with pytest.raises(RecommendError, match=re.escape(message)) as err:
                client.recommend_session(session, [7, 8], k=5, model=model, event_ids=ids)
            assert err.value.status in ("400", "StatusCode.INVALID_ARGUMENT")
        assert client.recommend_session(session, k=5, model=model).history_length == 4  # none of those stored
    with _upkeep(shop[1]) as store:  # the client's IDs are the members' IDs (store contract): once each
        members = store._client.zrange(store.settings.key(session), 0, -1)
    assert sorted(m for m in members if m.startswith("click-")) == ["click-1 50", "click-2 172", "click-3 181"]


@pytest.mark.parametrize("model", ["events", "events_native"])
def test_the_events_model_stores_an_event_sent_twice_with_its_id_once(shop, model):
    """The session layout's `events` model and the native session layout's `events_native` (appends in C++ on
    recserve's backend): each appends and answers how many the store acknowledged, nothing else; an event sent
    again with its ID is acknowledged and stored once, and the next answer by session has it; a bad ID, or items
    missing, fail their own request."""
    server, _, _ = shop
    session = f"events-only-{model}"
    with RecommenderClient(server.grpc_url) as client:
        assert client.send_events(session, [50, 172, 181], ["e-1", "e-2", "e-3"], model=model) == 3
        assert client.send_events(session, [50, 172, 181], ["e-1", "e-2", "e-3"], model=model) == 3  # a retry
        assert client.send_events(session, [258], model=model) == 1  # no ID: one of recserve's
        assert client.recommend_session(session, k=5).history_length == 4
        with pytest.raises(RecommendError, match="event_ids: 1 to 64 letters") as err:
            client.send_events(session, [7], ["bad id"], model=model)
        assert err.value.status in ("400", "StatusCode.INVALID_ARGUMENT")
        from tritonclient.utils import InferenceServerException

        with pytest.raises(InferenceServerException, match="item_ids"):  # a session without its items
            client.client.infer(model, [_bytes_input(client, "session_id", [[b"s"]])])
        config = client.client.get_model_config(model, as_json=True)["config"]
        assert [o["name"] for o in config["output"]] == ["stored"]
        assert client.recommend_session(session, k=5).history_length == 4  # nothing of those stored


def _bytes_input(client, name: str, rows: list[list[bytes]]):
    tensor = client.module.InferInput(name, [len(rows), len(rows[0])], "BYTES")
    tensor.set_data_from_numpy(np.array(rows, dtype=object))
    return tensor
