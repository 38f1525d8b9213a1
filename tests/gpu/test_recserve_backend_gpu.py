"""recserve's Triton backend on GPUs (run on a GPU machine; skipped elsewhere): the CUDA graphs it captures at
load answer what the TorchScript graph answers when run eagerly, at every bucket and for partial buckets,
on cuda:0 and, where there is one, on cuda:1; under business rules too (the graphs captured of its ``ruled``
method, and lists longer than a captured graph takes run uncaptured)."""

from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from tests.conftest import require_native, server_settings

from recserve.constants import NATIVE_PAD_ID
from recserve.serving.triton_repository.pbtxt import parse_pbtxt
from recserve.serving.triton_server.launcher import TritonServer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MAX_BATCH = 16  # buckets 1, 2, 4, 8, 16
ITEMS = 30_000  # past 100 chunks of 256 items: the GPU graph's top k through chunks, its rows in whole chunks


def _repository(tmp_path: Path, gpu: int) -> Path:
    from recserve.bench.synthetic import make_random_run
    from recserve.pipeline import repository_from_run
    from recserve.serving.triton_repository.repository_settings import RepositorySettings

    require_native("recserve")
    run = make_random_run(tmp_path / "run", num_items=ITEMS, hidden=64, layers=2, heads=2, window=20)
    repo = tmp_path / "repo"
    settings = RepositorySettings(device="gpu", gpus=(gpu,), max_batch_size=MAX_BATCH, instance_count=1)
    repository_from_run(run, repo, ("native",), settings, backend="torchscript", precision="fp32")
    config = parse_pbtxt((repo / "recommender_native" / "config.pbtxt").read_text())
    assert config.backend == "recserve", "on GPUs the native layout runs on recserve's backend by default"
    return repo


def _requests(rows: int, length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = np.where(rng.random((rows, length)) < 0.4, -1, rng.integers(1, ITEMS + 1, (rows, length)))
    ids[0] = -1  # an empty history
    return {
        "item_ids": ids.astype(np.int64),
        "k": rng.integers(1, 101, (rows, 1)).astype(np.int32),
        "exclude_seen": rng.integers(0, 2, (rows, 1)).astype(bool),
    }


def _eager(module, arrays: dict[str, np.ndarray], device: str) -> list[np.ndarray]:
    """The graph run eagerly on the rows padded to their bucket as the backend pads them (empty histories
    asking for one item): the same batch size as the replay, so the same kernels and the same answers."""
    rows = len(arrays["k"])
    bucket = 1 << (rows - 1).bit_length()
    fill = {"item_ids": NATIVE_PAD_ID, "k": 1, "exclude_seen": False}
    padded = [
        np.concatenate([value, np.full((bucket - rows, value.shape[1]), fill[name], value.dtype)])
        for name, value in arrays.items()
    ]
    with torch.inference_mode():
        out = module(*(torch.from_numpy(a).to(device) for a in padded))
    return [(t.float() if t.is_floating_point() else t).cpu().numpy()[:rows] for t in out]


@pytest.mark.parametrize("gpu", [0, 1])
def test_replayed_graphs_answer_what_the_graph_answers_eagerly(tmp_path, gpu):
    if gpu >= torch.cuda.device_count():
        pytest.skip(f"one GPU only: no cuda:{gpu}")
    repo = _repository(tmp_path, gpu)
    device = f"cuda:{gpu}"
    module = torch.jit.load(str(repo / "recommender_native" / "1" / "model.pt"), map_location=device).eval()
    length = parse_pbtxt((repo / "recommender_native" / "config.pbtxt").read_text()).input[0].dims[0]
    with TritonServer(repo, server_settings()) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        for rows in range(1, MAX_BATCH + 1):  # every bucket full (1, 2, 4, 8, 16) and every partial one
            arrays = _requests(rows, length, seed=rows)
            inputs = []
            for name, value in arrays.items():
                tensor = grpcclient.InferInput(
                    name, list(value.shape), {"item_ids": "INT64", "k": "INT32"}.get(name, "BOOL")
                )
                tensor.set_data_from_numpy(value)
                inputs.append(tensor)
            reply = client.infer("recommender_native", inputs)
            names = [o.name for o in reply.get_response().outputs]
            got = [reply.as_numpy(n) for n in names]
            expected = _eager(module, arrays, device)
            np.testing.assert_array_equal(got[0], expected[0], err_msg=f"item IDs, {rows} rows")
            np.testing.assert_allclose(got[1], expected[1], rtol=1e-6, err_msg=f"scores, {rows} rows")
            np.testing.assert_array_equal(got[2], expected[2], err_msg=f"unknown IDs, {rows} rows")
        stats = client.get_inference_statistics("recommender_native", as_json=True)["model_stats"][0]
        assert int(stats["execution_count"]) == MAX_BATCH


def _ruled_eager(module, arrays: dict[str, np.ndarray], bank: np.ndarray, listed: list, device: str):
    """``ruled`` run eagerly on the rows padded to their bucket (where the lists fit a captured graph), each
    row's listed items as vocabulary indices (excluded, included) padded with 0, as the backend stages them."""
    rows = len(arrays["k"])
    width = max(LISTED, max(len(x) for pair in listed for x in pair))
    bucket = 1 << (rows - 1).bit_length() if width == LISTED else rows  # longer lists: uncaptured, no bucket
    tables = np.zeros((2, bucket, width), dtype=np.int64)
    for r, pair in enumerate(listed):
        for side, indices in enumerate(pair):
            tables[side, r, : len(indices)] = indices
    fill = {"item_ids": NATIVE_PAD_ID, "k": 1, "exclude_seen": False}
    padded = [
        np.concatenate([value, np.full((bucket - rows, value.shape[1]), fill[name], value.dtype)])
        for name, value in arrays.items()
    ]
    rules = [bank, np.zeros(bucket, dtype=np.int64), tables[0], tables[1]]
    with torch.inference_mode():
        out = module.ruled(*(torch.from_numpy(a).to(device) for a in padded + rules))
    return [(t.float() if t.is_floating_point() else t).cpu().numpy()[:rows] for t in out]


LISTED = 128  # the listed items a captured graph takes (recserve.cc's kListed)


def test_replayed_graphs_under_rules_answer_what_the_ruled_graph_answers_eagerly(tmp_path):
    from recserve.artifacts.rule_bank import load_rule_bank

    repo = _repository(tmp_path, 0)
    module = torch.jit.load(str(repo / "recommender_native" / "1" / "model.pt"), map_location="cuda:0").eval()
    ids, _, bank = load_rule_bank(repo / "recommender_native" / "1" / "rules.pt")
    length = parse_pbtxt((repo / "recommender_native" / "config.pbtxt").read_text()).input[0].dims[0]
    with TritonServer(repo, server_settings()) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        for rows, count in [(1, 5), (3, 40), (8, 100), (5, 300)]:  # 300: longer than captured, run uncaptured
            arrays = _requests(rows, length, seed=50 + rows)
            rng = np.random.default_rng(rows)
            excluded = rng.choice(ids, (rows, count))
            included = np.where(np.arange(rows)[:, None] % 2 == 1, rng.choice(ids, (rows, count)), NATIVE_PAD_ID)
            inputs = []
            for name, value in (arrays | {"exclude_item_ids": excluded, "include_item_ids": included}).items():
                dtype = {"k": "INT32", "exclude_seen": "BOOL"}.get(name, "INT64")
                tensor = grpcclient.InferInput(name, list(value.shape), dtype)
                tensor.set_data_from_numpy(value)
                inputs.append(tensor)
            reply = client.infer("recommender_native", inputs)
            index = lambda row: [int(np.searchsorted(ids, x)) + 1 for x in row if x != NATIVE_PAD_ID]  # noqa: E731
            listed = [(index(e), index(i)) for e, i in zip(excluded, included)]
            expected = _ruled_eager(module, arrays, bank, listed, "cuda:0")
            names = [o.name for o in reply.get_response().outputs]
            got = [reply.as_numpy(n) for n in names]
            np.testing.assert_array_equal(got[0], expected[0], err_msg=f"item IDs, {rows} rows, {count} listed")
            np.testing.assert_allclose(got[1], expected[1], rtol=1e-6, err_msg=f"scores, {rows} rows")
            assert not set(got[0][0].tolist()) & set(excluded[0].tolist())
            if rows > 1:  # row 1 keeps to its list
                assert set(got[0][1][got[0][1] != NATIVE_PAD_ID].tolist()) <= set(included[1].tolist())
