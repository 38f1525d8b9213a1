"""Served answers are the trained model's own: on catalogues whose IDs are not their indices (large shuffled
integers, and random strings), the top 10 from the predictor, the fused, native and seed layouts and the
SageMaker handler equal the top 10 of the model's scores over the catalogue mapped through the run's ID
table, for a few hundred real histories (histories whose 10th and 11th scores nearly tie aside)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from tests.conftest import _train_tiny, model_top_ids, require_native, server_settings

from recserve.client import RecommenderClient
from recserve.data.datasets import load_prepared, prepare
from recserve.pipeline import repository_from_run
from recserve.serving.triton_server.launcher import TritonServer

ITEMS, USERS, STEPS, WINDOW = 60, 300, 16, 8


def _catalogue_ids(kind: str, rng: np.random.Generator) -> np.ndarray:
    if kind == "int":  # large and sparse, in an order unrelated to the sorted one that indexes them
        return rng.choice(np.arange(10**12, 10**12 + 10**7), ITEMS, replace=False)
    return np.array([f"sku-{x:08x}" for x in rng.choice(2**32, ITEMS, replace=False)])


@pytest.fixture(scope="module", params=["int", "str"])
def shuffled(request, tmp_path_factory) -> tuple[str, Path, Path]:
    """A log where users walk the catalogue in a fixed shuffled cycle, prepared and trained (tiny BERT4Rec)."""
    rng = np.random.default_rng(7)
    ids = _catalogue_ids(request.param, rng)
    starts = rng.integers(0, ITEMS, USERS)
    rows = [(f"u{u}", ids[(starts[u] + step) % ITEMS], step) for u in range(USERS) for step in range(STEPS)]
    folder = tmp_path_factory.mktemp(f"shuffled-{request.param}")
    pl.DataFrame(rows, schema=["user_id", "item_id", "timestamp"], orient="row").write_csv(folder / "log.csv")
    prepare(str(folder / "log.csv"), folder / "data")
    run = _train_tiny(folder / "data", folder / "run", window=WINDOW)
    return request.param, folder / "data", run


def _histories(data_dir: Path, count: int = 300) -> list[np.ndarray]:
    """The users' test histories (all but the last item) as IDs, the most recent WINDOW - 1 of them."""
    data = load_prepared(data_dir)
    seq = data.sequences.truncated(1)
    return [data.vocab.ids[seq.items[a:b][-(WINDOW - 1) :] - 1] for a, b in zip(seq.offsets, seq.offsets[1:])][:count]


def _assert_same(got: list, want: np.ndarray, clear: np.ndarray, what: str) -> None:
    assert clear.mean() > 0.8, "too many near-ties for the check to mean anything"
    wrong = [i for i in np.flatnonzero(clear) if list(got[i]) != list(want[i])]
    assert not wrong, (
        f"{what}: {len(wrong)} of {clear.sum()} histories differ, e.g. {list(got[wrong[0]])} != {list(want[wrong[0]])}"
    )


def test_the_predictor_and_the_sagemaker_handler_answer_the_models_top_10(shuffled, tmp_path):
    import json

    from recserve.export.exporter import export_run
    from recserve.serving.predictor import Predictor
    from recserve.serving.sagemaker.handler import input_fn, model_fn, output_fn, predict_fn
    from recserve.serving.sagemaker.package import package, unpack

    kind, data_dir, run = shuffled
    histories = _histories(data_dir)
    want, clear = model_top_ids(run, histories, exclude_seen=True)
    export_run(run, "eager", "fp32", tmp_path / "export")
    answers = Predictor.load(tmp_path / "export").answer(histories, k=10)
    _assert_same(list(answers.item_ids), want, clear, "predictor")
    handler = model_fn(
        str(unpack(package(tmp_path / "export", "pytorch", tmp_path / "m.tar.gz")["package"], tmp_path / "u"))
    )
    served = []
    for history in histories:
        body = json.dumps({"item_id": history.tolist(), "k": 10}).encode()
        served.append(
            json.loads(output_fn(predict_fn(input_fn(body, "application/json"), handler), "application/json")[0])[
                "item_id"
            ]
        )
    _assert_same(served, want if kind == "str" else want.tolist(), clear, "sagemaker handler")


def test_every_triton_layout_answers_the_models_top_10(shuffled, tmp_path):
    import tritonclient.http as httpclient

    kind, data_dir, run = shuffled
    require_native("pytorch")
    layouts = ("fused", "native", "seed") if kind == "int" else ("fused", "seed")
    repository_from_run(run, tmp_path / "repo", layouts, backend="eager")
    histories = _histories(data_dir)
    want, clear = model_top_ids(run, histories, exclude_seen=True)
    want_all, clear_all = model_top_ids(run, histories, exclude_seen=False)
    with TritonServer(tmp_path / "repo", server_settings()) as server:
        for model in ("recommender", "recommender_native")[: len(layouts) - 1]:
            with RecommenderClient(server.grpc_url, model=model) as client:
                got = [client.recommend(h, k=10).item_ids for h in histories]
            _assert_same(got, want, clear, model)
        seed = httpclient.InferenceServerClient(server.http_url)  # the PoC's contract: IDs in, no exclusion
        got = []
        for history in histories:  # 39 IDs, the history last, unknown ones before it (dropped)
            if kind == "str":
                value = np.array([b""] * (39 - len(history)) + [x.encode() for x in history], dtype=object)
            else:
                value = np.concatenate([np.zeros(39 - len(history), dtype=np.int64), history])
            request = httpclient.InferInput("inputs", [39], "BYTES" if kind == "str" else "INT64")
            request.set_data_from_numpy(value)
            answer = seed.infer("bert4rec_ensemble", [request]).as_numpy("output__0")[:10]
            got.append([x.decode() for x in answer] if kind == "str" else answer.tolist())
        _assert_same(got, want_all, clear_all, "seed")
