"""A failover of the session store under a mixed load, in both layouts by session: recserve's embedded store
with a primary, a replica and a Sentinel on loopback (replicated_store.py), appends acknowledged once the
replica holds them (acknowledge "replica"). The primary is killed (SIGKILL) while events are sent and
requests asked; every acknowledged event is in the store after, once; by-session answers resume within
10 s; every request is answered or refused with the typed store error."""

import dataclasses
import os
import signal
import threading
import time

import numpy as np
import pytest

from recserve.client.triton import SessionStoreError
from recserve.errors import StoreError
from recserve.serving.triton_server.launcher import TritonServer
from recserve.sessions import embedded_store, replicated_store
from recserve.sessions.session_store import Event, SessionStore
from tests.conftest import require_native, server_settings
from tests.sessions.conftest import store_client, write_session_repository
from tests.sessions.test_session_serving import BY_SESSION, Session


@pytest.fixture(scope="module", params=list(BY_SESSION))
def failover_stack(request, tiny_export, tiny_torchscript, tmp_path_factory):
    layout = request.param
    root = tmp_path_factory.mktemp(f"failover-{layout}")
    if layout == "native_session":
        require_native("recserve")
    store = root / "store"
    replicated_store.start(store, acknowledge="replica")
    try:
        write_session_repository(layout, tiny_export, tiny_torchscript, root / "repo", store)
        with TritonServer(root / "repo", server_settings()) as server:
            yield server, store, layout
    finally:
        replicated_store.stop(store)


def test_a_failover_under_load_loses_no_acknowledged_event_and_answers_resume(failover_stack):
    server, folder, layout = failover_stack
    settings = embedded_store.settings_of(folder)
    with SessionStore(settings) as store:
        store.append([Event(f"shopper-{n}", item) for n in range(4) for item in (50, 172)])
    acknowledged: list[str] = []
    outcomes: list[tuple[float, str]] = []
    stop = threading.Event()

    def events(writer: int) -> None:
        with SessionStore(dataclasses.replace(settings, window=1_000_000)) as store:  # every event kept
            n = 0
            while not stop.is_set():
                event = Event(f"events-{writer}", 1 + n % 500, event_id=f"w{writer}-{n}")
                try:
                    if store.append([event]).accepted:
                        acknowledged.append(f"{event.event_id} {event.item}")
                        n += 1
                except StoreError:
                    time.sleep(0.05)  # sent again, with its ID, until acknowledged

    def requests() -> None:
        with Session(server.grpc_url, layout) as client:
            n = 0
            while not stop.is_set():
                try:
                    answer = client.recommend_session(f"shopper-{n % 4}", k=5)
                    outcomes.append((time.monotonic(), "answered" if len(answer.item_ids) == 5 else "short"))
                except SessionStoreError:
                    outcomes.append((time.monotonic(), "store error"))
                except Exception as err:  # counted: the test's point
                    outcomes.append((time.monotonic(), f"failed: {err!r}"))
                n += 1
                time.sleep(0.01)

    threads = [threading.Thread(target=events, args=(w,)) for w in range(2)]
    threads += [threading.Thread(target=requests) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    primary = replicated_store.primary_folder(folder)
    killed_at = time.monotonic()
    os.kill(int((primary / embedded_store.PID_FILE).read_text()), signal.SIGKILL)
    time.sleep(3.0)
    embedded_store.start(primary)  # the old primary back: the Sentinel makes it the new primary's replica
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not (
        replicated_store.primary_folder(folder) != primary
        and len(acknowledged) > 20
        and _answered_since(outcomes, killed_at + 12)
    ):
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(30)

    kinds = {kind for _, kind in outcomes}
    assert kinds <= {"answered", "store error"}, kinds
    after = [at for at, kind in outcomes if at > killed_at]
    failed_after = [at for at, kind in outcomes if at > killed_at and kind != "answered"]
    resumed = (max(failed_after) if failed_after else killed_at) - killed_at
    assert after and resumed < 10, f"by-session answers resumed {resumed:.1f} s after the kill"
    new_primary = replicated_store.primary_folder(folder)
    assert new_primary != primary
    reader = store_client(embedded_store.admin_settings(new_primary))
    stored = [m for w in range(2) for m in reader.zrange(settings.key(f"events-{w}"), 0, -1)]
    assert len(acknowledged) > 20
    assert not set(acknowledged) - set(stored), "an acknowledged event was lost in the failover"
    ids = [m.split(" ")[0] for m in stored]
    assert len(ids) == len(set(ids)), "an event stored twice"
    assert np.mean([kind == "answered" for _, kind in outcomes]) > 0.5
    counts = {kind: sum(k == kind for _, k in outcomes) for kind in kinds}
    print(
        f"{layout}: {len(acknowledged)} acknowledged, 0 lost; answers resumed {resumed:.2f} s after the kill; {counts}"
    )


def _answered_since(outcomes, since: float) -> bool:
    return any(at > since and kind == "answered" for at, kind in outcomes)


def test_the_replicated_store_started_again_after_a_failover_follows_the_new_primary(tmp_path):
    """`replicated_store.start` on a folder whose Sentinel has promoted the replica starts the old primary as
    the new one's replica (it does not come back as a second primary)."""
    folder = tmp_path / "store"
    replicated_store.start(folder)
    try:
        primary = replicated_store.primary_folder(folder)
        os.kill(int((primary / embedded_store.PID_FILE).read_text()), signal.SIGKILL)
        deadline = time.monotonic() + 20
        while replicated_store.primary_folder(folder) == primary:
            assert time.monotonic() < deadline, "the Sentinel promoted no replica"
            time.sleep(0.2)
        replicated_store.start(folder)
        assert replicated_store.primary_folder(folder) != primary
        assert "replicaof 127.0.0.1" in (primary / "server.conf").read_text()
        with SessionStore(embedded_store.settings_of(folder)) as store:
            assert store.append([Event("s", 1, event_id="after")]).accepted == 1
    finally:
        replicated_store.stop(folder)
