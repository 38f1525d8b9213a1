"""New items on day one: an item that no training event holds is learned as its attributes alone
(``--item-attributes``), left out of every training softmax, ranked among the new items by evaluate, and given a
share of the answer by exploration (``--explore-new``) in every export backend."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from recserve.artifacts.item_table import Attribute, ItemAttributes
from recserve.models.attribute_codes import NUMBER_BINS, attribute_codes
from recserve.models.serving_graph import explore_slots, explored_top

NEW_SHARE = 0.1


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recserve.cli.main", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def new_films(tmp_path_factory) -> Path:
    """ML-100K with its genre and year as an item table; a tenth of the films keep only the events that are a
    user's last (the test targets), so no training event holds them, and every film stays in the catalogue
    (``unseen_items``)."""
    import polars as pl

    from recserve.data.datasets import PrepareOptions, prepare
    from recserve.data.io import read_ml100k

    frame, titles = read_ml100k()
    films = np.sort(frame["item_id"].unique().to_numpy())
    new = np.random.default_rng(0).choice(films, size=round(NEW_SHARE * len(films)), replace=False)
    frame = frame.sort(["user_id", "timestamp"], maintain_order=True)
    last = pl.int_range(pl.len()).over("user_id") == pl.len().over("user_id") - 1
    folder = tmp_path_factory.mktemp("new-films")
    frame.filter(~pl.col("item_id").is_in(new.tolist()) | last).write_csv(folder / "log.csv")
    titles.select("item_id", "genre", "year").write_csv(folder / "films.csv")
    prepare(
        str(folder / "log.csv"), folder / "data", PrepareOptions(items=str(folder / "films.csv"), unseen_items=True)
    )
    return folder / "data"


@pytest.fixture(scope="module")
def attribute_run(new_films, tmp_path_factory) -> Path:
    from tests.conftest import _train_tiny

    return _train_tiny(new_films, tmp_path_factory.mktemp("attributes") / "run", model="sasrec")


def _trained(data: Path) -> np.ndarray:
    from recserve.data.datasets import load_prepared
    from recserve.train.leave_one_out import history_counts

    prepared = load_prepared(data)
    return history_counts(prepared.train, prepared.vocab.size) > 0


def test_each_attribute_kind_becomes_rows_of_one_table_and_rare_or_missing_values_none():
    rows = 6
    attributes = ItemAttributes(
        rows,
        {
            "genre": Attribute("genre", "string", np.array([0, 0, 1, 2, 2, -1]), np.array(["a", "b", "c"])),
            "new": Attribute("new", "bool", np.array([1, 0, -1, 1, 1, 0], dtype=np.int8)),
            "price": Attribute("price", "number", np.array([1.0, 2.0, np.nan, 4.0, 5.0, 6.0])),
        },
    )
    codes = attribute_codes(attributes)
    genre, flag, price = codes.codes[:, 1:-1]  # padding and the mask token: none
    assert (codes.codes[:, [0, -1]] == 0).all()
    assert genre.tolist() == [1, 1, 0, 2, 2, 0]  # "b" is held by one item: too rare; a missing value: none
    assert flag.tolist() == [3, 4, 0, 3, 3, 4]  # after genre's two rows: true, false; missing none
    assert price[2] == 0 and len(set(price[[0, 1, 3, 4, 5]])) == 5 and price.min(initial=99) >= 0
    assert codes.rows == 1 + 2 + 2 + (price.max() - 4) and codes.rows <= 1 + 2 + 2 + NUMBER_BINS
    assert codes.names == ("genre", "new", "price")


def test_a_new_item_is_its_attributes_alone_and_scored_by_them(attribute_run, new_films):
    from dataclasses import replace

    from recserve.models.run_loader import load_run

    model = load_run(attribute_run)
    assert model.attributes is not None and model.cfg.attribute_columns == 2  # genre and year
    trained = _trained(new_films)
    trained[[0, -1]] = True  # padding and the mask token keep their own rows
    assert (model.attributes.trained.numpy() == trained).all()
    codes = model.attributes.codes.numpy()  # (V, A)
    new = np.flatnonzero(~trained)
    alike = [(a, b) for a in new for b in new if a < b and (codes[a] == codes[b]).all()]
    unlike = [(a, b) for a in new for b in new if a < b and (codes[a] != codes[b]).any()]
    assert alike and unlike
    tokens = torch.tensor([[0, 5, 9, model.cfg.mask_index], [0, 0, 40, model.cfg.mask_index]])
    with torch.no_grad():
        before = model(tokens)
        model.prepare_inference()  # the attributes folded into the plain table: the same scores
        after = model(tokens)
    assert model.attributes is None and bool(model.untrained[new].all()) and int(model.untrained.sum()) == len(new)
    torch.testing.assert_close(before, after)
    plain = model.__class__(replace(model.cfg, item_attributes=False))  # served: the plain model's very shape
    plain.prepare_inference()
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in plain.state_dict().items()}
    assert all(torch.equal(after[:, a], after[:, b]) for a, b in alike)  # no ID row: only attributes tell them apart
    assert any(not torch.allclose(after[:, a], after[:, b]) for a, b in unlike)


def test_the_training_softmax_leaves_new_items_out_never_scored_never_drawn():
    from recserve.train.losses import CatalogueLoss
    from recserve.train.train_config import LossSettings

    vocab, hidden = 12, 4
    popularity = np.arange(vocab, dtype=np.int64)
    left_out = np.zeros(vocab, dtype=bool)
    left_out[[3, 7]] = True
    table = torch.randn(vocab, hidden, requires_grad=True)
    bias = torch.zeros(vocab, requires_grad=True)
    query, targets = torch.randn(5, hidden), torch.tensor([1, 2, 4, 5, 6])
    full = CatalogueLoss(LossSettings(name="full"), popularity, vocab - 1, left_out=left_out)
    full(query, table, bias, targets).sum().backward()
    assert table.grad[[3, 7]].abs().sum() == 0 and bias.grad[[3, 7]].abs().sum() == 0
    assert table.grad[[8, 9]].abs().sum() > 0  # any other item is a negative
    sampled = CatalogueLoss(
        LossSettings(name="sampled-uniform", negatives=4096), popularity, vocab - 1, left_out=left_out
    )
    drawn = sampled.draw(torch.Generator().manual_seed(0))
    assert not np.isin(drawn.numpy(), [3, 7]).any() and np.isin([8, 9], drawn.numpy()).all()


def test_evaluate_ranks_the_new_targets_among_the_new_items_beside_attribute_baselines(attribute_run, new_films):
    from recserve.train.run_evaluation import evaluate_test

    new = evaluate_test(attribute_run, new_films)["new_items"]
    assert new["targets"] > 20 and new["new_items"] >= new["targets"] // 4
    for who in ("model", "attribute_popularity", "attribute_profile"):
        assert 0 <= new[who]["hr@10"] <= 1
    # ranked among the new items alone: a random order would hit 10 in new_items
    assert new["model"]["hr@10"] > 10 / new["new_items"]


def test_without_attributes_the_model_learns_ids_alone(new_films, tmp_path):
    from tests.conftest import _train_tiny

    from recserve.models.run_loader import load_run

    run = _train_tiny(new_films, tmp_path / "run", model="sasrec", item_attributes=False)
    model = load_run(run)
    assert model.attributes is None and model.cfg.attribute_columns == 0
    assert not any(key.startswith("attributes.") for key in model.state_dict())


def test_exploration_reserves_every_tenth_column_and_fills_a_row_short_of_new_items():
    assert explore_slots(0.1, 30) == [9, 19, 29] and explore_slots(0.25, 8) == [3, 7] and explore_slots(0, 10) == []
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 40, generator=generator)
    scores[:, 0] = float("-inf")  # padding, as in every graph's scores
    new = torch.tensor([3, 11, 17])
    is_new = torch.zeros(40, dtype=torch.bool)
    is_new[new] = True
    scores[:, new] -= 10  # new items score below every other: only exploration shows them
    scores[1, new] = float("-inf")  # a rule hides every new item in row 1
    scores[2, [11, 17]] = float("-inf")  # and two of them in row 2
    slots = torch.zeros(20, dtype=torch.bool)
    slots[explore_slots(0.1, 20)] = True
    top_scores, top = explored_top(scores, 20, new, slots, 2)
    plain = scores.topk(20, dim=1).indices
    best_new = scores[0].masked_fill(~is_new, float("-inf")).topk(2).indices
    assert top[0, [9, 19]].tolist() == best_new.tolist()
    assert torch.equal(top[0, is_new[top[0]].logical_not()], plain[0, :18])  # the others in order
    # more slots than new items: the third slot is filled from the others
    wide = torch.zeros(40, dtype=torch.bool)
    wide[explore_slots(0.1, 40)] = True
    _, widest = explored_top(scores, 40, new, wide, 4)
    assert set(widest[0, [9, 19, 29]].tolist()) == {3, 11, 17} and not is_new[widest[0, 39]]
    assert torch.equal(top[1], plain[1])  # none to explore: the plain answer, no gap
    assert top[2, 9] == 3 and torch.equal(top[2, top[2] != 3], plain[2, :19])
    assert bool(torch.isfinite(top_scores).all())
    assert torch.equal(top_scores.gather(1, torch.arange(20).expand(3, -1)), scores.gather(1, top))


@pytest.mark.parametrize("backend", ["torchscript", "onnx"])
def test_an_export_that_explores_answers_new_items_at_its_columns_in_every_backend(attribute_run, backend, tmp_path):
    from recserve.export.exporter import export_run
    from recserve.export.graph import build_graph, example_inputs, load_spec

    manifest = export_run(attribute_run, backend, "fp32", tmp_path / backend, explore_new=0.1)  # parity-checked
    assert manifest.explore_new == 0.1 and manifest.validation["max_score_diff"] < 1e-3
    spec = load_spec(attribute_run)
    graph = build_graph(attribute_run, spec, 100, "fp32", 0.1)
    plain = build_graph(attribute_run, spec, 100, "fp32", 0.0)
    *inputs, included = example_inputs(spec, batch=8, length=20, seed=1)
    inputs = (*inputs, torch.zeros_like(included))  # no row keeps to a list (a list's row explores none)
    with torch.no_grad():
        explored_ids, _ = graph(*inputs)
        plain_ids, _ = plain(*inputs)
    new_ids = set(spec.vocab_ids[graph.head.new_items.numpy() - 1].tolist())
    assert all(int(i) in new_ids for i in explored_ids[:, 9])  # column 9 of every answer: a new film
    for explored, plain_row in zip(explored_ids.tolist(), plain_ids.tolist()):
        if not new_ids & set(plain_row[:10]):  # no new film in the plain top 10: exploration took column 9
            assert explored[:9] == plain_row[:9]


def test_explore_new_on_a_run_with_no_new_items_or_out_of_range_is_refused_in_one_line(vae_run, tmp_path):
    out = str(tmp_path / "e")
    result = _cli("export", "--run", str(vae_run), "--backend", "eager", "--explore-new", "0.1", "--out", out)
    assert result.returncode == 1 and "no new items to explore" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr and not (tmp_path / "e").exists()
    result = _cli("export", "--run", str(vae_run), "--explore-new", "1.5", "--out", out)
    assert result.returncode == 1 and "lies in [0, 1)" in result.stdout + result.stderr


@pytest.mark.usefixtures("native_backends_built")
def test_a_served_repository_that_explores_shows_a_new_film_in_every_tenth_column(attribute_run, tmp_path):
    """The fused model (ONNX Runtime through the python model) and the native one (Triton's own ONNX Runtime
    backend) of a repository written with --explore-new 0.1, on the real Triton."""
    from tests.conftest import server_settings

    from recserve.client import RecommenderClient
    from recserve.export.graph import load_spec
    from recserve.models.run_loader import load_run
    from recserve.pipeline import repository_from_run
    from recserve.serving.triton_server.launcher import TritonServer

    repo = tmp_path / "repo"
    repository_from_run(attribute_run, repo, ("fused", "native"), backend="onnx", explore_new=0.1)
    spec = load_spec(attribute_run)
    record = json.loads((repo / "recserve.json").read_text())
    assert all(export["explore_new"] == 0.1 for export in record["layouts"].values())
    model = load_run(attribute_run)
    model.prepare_inference()
    new_ids = set(spec.vocab_ids[np.flatnonzero(model.untrained.numpy()) - 1].tolist())
    with TritonServer(repo, server_settings()) as server:
        for name in ("recommender", "recommender_native"):
            with RecommenderClient(server.grpc_url, model=name) as client:
                for history in ([1, 2, 3], [50, 181], [300]):
                    answer = client.recommend(history, k=10)
                    assert len(answer.item_ids) == 10 and int(answer.item_ids[9]) in new_ids, (name, history)
                    assert len(set(answer.item_ids.tolist())) == 10


def test_a_warm_start_carries_the_attribute_rows_only_where_they_mean_the_same_values(attribute_run, new_films):
    from dataclasses import replace

    from recserve.data.datasets import load_prepared
    from recserve.models.attribute_codes import AttributeCodes, attribute_codes
    from recserve.models.run_loader import load_config, load_run
    from recserve.train.warm_start import carry_by_id

    old = load_run(attribute_run)
    data = load_prepared(new_films)
    codes, trained = attribute_codes(data.attributes()), _trained(new_films)
    for shuffled in (False, True):
        model = old.__class__(load_config(attribute_run))
        used = codes
        if shuffled:  # the same shape, other meanings: genre's rows read in another order
            order = np.random.default_rng(0).permutation(codes.codes.shape[1])
            used = replace(codes, codes=codes.codes[:, order])
        model.attributes.set_codes(AttributeCodes(used.codes, used.rows, used.names), trained)
        carry_by_id(model, model.cfg, "sasrec", data.vocab.ids, attribute_run)
        same = torch.equal(model.attributes.table.weight, old.attributes.table.weight)
        assert same is not shuffled
        assert torch.equal(model.attributes.codes, torch.as_tensor(used.codes.T))  # the new data's own


def test_id_dropout_teaches_some_trained_items_as_new_ones_in_training_alone():
    from recserve.models.attribute_codes import AttributeCodes
    from recserve.models.model_configs import SASRecConfig
    from recserve.models.sasrec import SASRec

    num_items, hidden = 200, 8
    cfg = SASRecConfig(num_items=num_items, window=4, hidden=hidden, heads=1, layers=1, attribute_columns=1,
                       attribute_rows=3, id_dropout=0.5)  # fmt: skip
    model = SASRec(cfg)
    codes = np.zeros((1, num_items + 2), dtype=np.int64)
    codes[0, 1:-1] = 1 + np.arange(num_items) % 2
    model.attributes.set_codes(AttributeCodes(codes, 3, ("kind",)), np.ones(num_items + 2, dtype=bool))
    own = model.item_emb.weight
    alone = model.attributes.table.weight[torch.as_tensor(codes[0])]  # each item's attributes alone
    with torch.no_grad():
        model.train()
        vectors = model.item_vectors()
        as_new = torch.isclose(vectors, alone).all(1)
        assert 0.3 < float(as_new[1:-1].float().mean()) < 0.7  # about half, drawn afresh each call
        assert not as_new[[0, -1]].any()  # padding and the mask token keep their rows
        model.eval()
        torch.testing.assert_close(model.item_vectors(), own + alone)  # serving never drops
