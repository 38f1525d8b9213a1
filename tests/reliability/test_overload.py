"""Overload: a burst far above capacity gets fast, typed, retryable rejections; the admitted get answers.

Bounded: one burst of 300 requests on loopback, then a short retry loop.
"""

import asyncio
import time

import numpy as np
import pytest

from recserve.client import AsyncRecommenderClient, RecommenderClient, ServerBusyError
from recserve.pipeline import repository_from_run
from recserve.serving.triton_repository.repository_settings import RepositorySettings
from recserve.serving.triton_server.launcher import TritonServer
from tests.conftest import server_settings

BURST = 300
QUEUE_TIMEOUT_US = 200_000


@pytest.fixture(scope="module")
def small_queue_server(tiny_run, tmp_path_factory):
    repo = tmp_path_factory.mktemp("overload") / "repo"
    settings = RepositorySettings(max_batch_size=4, max_queue_size=4, queue_timeout_microseconds=QUEUE_TIMEOUT_US)
    repository_from_run(tiny_run, repo, ("fused",), settings, backend="onnx")
    with TritonServer(repo, server_settings()) as server:
        yield server


async def _burst(url: str) -> dict:
    client = AsyncRecommenderClient(url)
    outcome = {"ok": [], "busy": [], "other": []}

    async def one():
        start = time.perf_counter()
        try:
            await client.recommend(list(range(1, 19)))
            outcome["ok"].append(time.perf_counter() - start)
        except ServerBusyError:
            outcome["busy"].append(time.perf_counter() - start)
        except Exception as err:
            outcome["other"].append(repr(err))

    await asyncio.gather(*(one() for _ in range(BURST)))
    await client.close()
    return outcome


def test_a_burst_above_capacity_is_shed_with_typed_rejections(small_queue_server):
    outcome = asyncio.run(_burst(small_queue_server.grpc_url))
    sent, ok, busy = BURST, len(outcome["ok"]), len(outcome["busy"])
    print(
        f"overload: sent {sent}, answered {ok}, rejected busy {busy}, other errors {len(outcome['other'])}; "
        f"admitted p99 {np.percentile(outcome['ok'], 99) * 1e3:.0f} ms"
    )
    assert outcome["other"] == []  # every request was either answered or rejected as busy: none lost
    assert ok + busy == sent and ok > 0 and busy > 0
    assert small_queue_server.is_ready()  # ready again as soon as the burst ends


def test_bounded_retries_with_backoff_get_through_during_a_burst(small_queue_server, monkeypatch):
    """Requests sent while bursts fill the queue: some are refused and retried (the client's backoff sleeps
    are counted), and with enough retries every one is answered."""
    import threading

    from recserve.client import triton as client_module

    waits, answered, failed, done = [], [], [], threading.Event()
    sleep = time.sleep
    monkeypatch.setattr(client_module.time, "sleep", lambda s: waits.append(s) or sleep(s))
    patient = RecommenderClient(small_queue_server.grpc_url, retries=40, backoff_s=0.005)

    def send():
        while not done.is_set():
            try:
                answered.append(len(patient.recommend(list(range(1, 19)), k=5).item_ids))
            except Exception as err:  # a request the retries did not get through
                failed.append(repr(err))

    senders = [threading.Thread(target=send) for _ in range(4)]
    for thread in senders:
        thread.start()
    try:
        for _ in range(3):  # the queue stays full while the senders send
            asyncio.run(_burst(small_queue_server.grpc_url))
    finally:
        done.set()
        for thread in senders:
            thread.join(60)
    assert failed == [] and answered and set(answered) == {5}  # every patient request was answered
    assert waits, "no request was refused and retried: the bursts did not overlap the senders"


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_no_server_at_the_address_is_retried_then_named(protocol):
    """Nothing listening: each retry waits its backoff (doubling, with jitter), then the error says so."""
    import time

    from recserve.client import ServerUnreachableError
    from recserve.processes import free_ports

    [port] = free_ports(1)
    client = RecommenderClient(f"127.0.0.1:{port}", protocol, retries=3, backoff_s=0.05, timeout_s=2)
    started = time.monotonic()
    with pytest.raises(ServerUnreachableError, match=f"no server answers at 127.0.0.1:{port} \\({protocol}\\)"):
        client.recommend([1, 2, 3])
    assert time.monotonic() - started >= 0.05 * (1 + 2 + 4)  # three backoffs: retried, not given up at once
