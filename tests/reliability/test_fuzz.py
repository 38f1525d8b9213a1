"""Bad input at scale: random shapes, dtypes, empty and huge tensors, random bytes, over HTTP and gRPC.

Every answer must be a success or a clean 4xx (gRPC: INVALID_ARGUMENT), the server ready throughout.
Bounded: a fixed number of examples per protocol, loopback only.
"""

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

EXAMPLES = 40
DTYPES = {"INT64": np.int64, "INT32": np.int32, "FP32": np.float32, "BOOL": np.bool_, "BYTES": np.object_}
CLEAN_HTTP = {200, 400}
CLEAN_GRPC = {"StatusCode.INVALID_ARGUMENT"}
GRPC_DEADLINE_S = 5

shapes = st.lists(st.integers(0, 70), min_size=0, max_size=3)
tensor_names = st.sampled_from(["item_ids", "k", "exclude_seen", "nonsense"])


def _post(url: str, body: bytes, timeout_s: float = 30) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _clean(status: int, body: bytes) -> bool:
    """A success, a 4xx, or Triton 2.51's own answer to malformed JSON: 500 naming the parse error."""
    parse_error = status == 500 and (b"parse" in body.lower() or b"json" in body.lower())
    return status in CLEAN_HTTP or 400 <= status < 500 or parse_error


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=tensor_names, dtype=st.sampled_from(list(DTYPES)), shape=shapes, seed=st.integers(0, 2**31 - 1))
def test_random_json_tensors_get_a_clean_answer(int_server, name, dtype, shape, seed):
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape)) if shape else 1
    data = [rng.integers(-5, 3000) if dtype != "BYTES" else "x" * int(rng.integers(0, 5)) for _ in range(count)]
    if dtype in ("FP32",):
        data = [float(x) for x in data]
    if dtype == "BOOL":
        data = [bool(x % 2) for x in data]
    body = {"inputs": [{"name": name, "shape": shape, "datatype": dtype, "data": data}]}
    zero_batch = len(shape) == 2 and shape[0] == 0 and name == "item_ids"  # zero rows, so zero bytes
    try:
        status, reply = _post(
            f"http://{int_server.http_url}/v2/models/recommender/infer",
            json.dumps(body, default=int).encode(),
            timeout_s=GRPC_DEADLINE_S if zero_batch else 30,
        )
    except TimeoutError:
        # Triton 2.51 never answers a zero-byte, zero-batch tensor (as over gRPC below); the client's timeout
        # ends it, and the server stays ready (checked after every example)
        assert zero_batch, (name, dtype, shape)
        return
    # well-formed JSON: a 200 or a 4xx, never a 500; a 200 only with the one required input, and then an answer
    assert status in CLEAN_HTTP or 400 <= status < 500, (name, dtype, shape, status, reply[:200])
    if status == 200:
        assert name == "item_ids", (name, dtype, shape, reply[:200])
        outputs = {o["name"]: o for o in json.loads(reply)["outputs"]}
        assert len(outputs["item_ids"]["data"]) == len(outputs["scores"]["data"]) > 0


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(min_size=0, max_size=2048))
def test_random_bytes_bodies_get_a_clean_error(int_server, body):
    status, reply = _post(f"http://{int_server.http_url}/v2/models/recommender/infer", body)
    assert status != 200 and _clean(status, reply), (body[:50], status, reply[:200])


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    dtype=st.sampled_from(["INT64", "INT32", "FP32", "BOOL"]),
    rows=st.integers(0, 3),
    length=st.integers(0, 300),
    k=st.one_of(st.none(), st.integers(-3, 200)),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_grpc_requests_are_answered_or_refused_cleanly(int_server, dtype, rows, length, k, seed):
    rng = np.random.default_rng(seed)
    values = rng.integers(-10, 2000, (rows, length)).astype(DTYPES[dtype])
    client = grpcclient.InferenceServerClient(int_server.grpc_url)
    inputs = [grpcclient.InferInput("item_ids", list(values.shape), dtype)]
    inputs[0].set_data_from_numpy(values)
    if k is not None:
        inputs.append(grpcclient.InferInput("k", [max(rows, 1), 1], "INT32"))
        inputs[-1].set_data_from_numpy(np.full((max(rows, 1), 1), k, dtype=np.int32))
    try:
        result = client.infer("recommender", inputs, client_timeout=GRPC_DEADLINE_S)
    except InferenceServerException as err:
        if rows == 0 and length == 0 and str(err.status()) == "StatusCode.DEADLINE_EXCEEDED":
            return  # Triton 2.51 never answers a zero-byte, zero-batch tensor; the client's deadline ends it
        assert str(err.status()) in CLEAN_GRPC, (dtype, rows, length, k, err.message())
    else:
        assert dtype == "INT64" and rows >= 1 and (k is None or 1 <= k <= 100)
        assert result.as_numpy("item_ids").shape[0] == rows


def test_an_oversized_body_is_refused_and_the_server_stays_ready(int_server):
    huge = json.dumps(
        {"inputs": [{"name": "item_ids", "shape": [1, 2_000_000], "datatype": "INT64", "data": [1] * 2_000_000}]}
    ).encode()
    status, reply = _post(f"http://{int_server.http_url}/v2/models/recommender/infer", huge)
    assert status in (200, 400, 413), (status, reply[:200])
    assert int_server.is_ready()


@pytest.fixture(autouse=True)
def _server_stays_ready(int_server):
    yield
    assert int_server.is_ready()
