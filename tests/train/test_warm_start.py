"""Warm start by item ID: a run on an older catalogue carried to a newer one that gained and lost items, each
item's rows looked up by its ID (never its index), new items from the old catalogue's mean, and a run of another
model or other settings refused in one line."""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from recserve.cli.main import app
from recserve.data.datasets import load_prepared
from recserve.data.io import read_ml100k
from recserve.errors import ConfigError
from recserve.models.model_configs import SASRecConfig
from recserve.models.run_loader import load_run
from recserve.train.trainer import TrainConfig, train
from recserve.train.warm_start import carry_by_id

SMALL = {"window": 20, "hidden": 16, "layers": 1, "heads": 2}


@pytest.fixture(scope="module")
def catalogues(tmp_path_factory):
    """ML-100K without items 1501..1682 (the old log) and without items 1..100 (the new one: 182 items gained,
    100 lost), prepared; and a SASRec run on the old one."""
    root = tmp_path_factory.mktemp("warm")
    log, _ = read_ml100k()
    folders = {}
    shifted = (log["item_id"] > 100) & (log["item_id"] <= 1600)  # 1,500 items again: 100 gained, 100 lost
    for name, keep in (("old", log["item_id"] <= 1500), ("new", log["item_id"] > 100), ("shifted", shifted)):
        log.filter(keep).write_csv(root / f"{name}.csv")
        args = ["data", str(root / f"{name}.csv"), "--out", str(root / name), "--time-col", "timestamp"]
        assert CliRunner().invoke(app, args).exit_code == 0
        folders[name] = root / name
    cfg = TrainConfig(epochs=1, samples_per_user=1, device="cpu", resume=False)
    train(folders["old"], root / "old-run", SMALL, cfg, model="sasrec")
    return folders, root / "old-run"


@pytest.mark.parametrize("catalogue", ["new", "shifted"])  # shifted: of the old one's size, never carried by index
def test_each_item_keeps_its_own_rows_by_id_and_a_new_item_starts_from_the_mean(catalogues, catalogue):
    folders, old_run = catalogues
    old, new = load_prepared(folders["old"]), load_prepared(folders[catalogue])
    old_model = load_run(old_run)
    model = load_run(old_run).__class__(SASRecConfig(num_items=new.vocab.num_items, **SMALL))
    carried = carry_by_id(model, model.cfg, "sasrec", new.vocab.ids, old_run)
    gained = {"new": 182, "shifted": 100}[catalogue]
    assert carried["items_carried"] == 1400 and carried["items_new"] == gained and carried["items_dropped"] == 100
    old_rows = {int(i): n + 1 for n, i in enumerate(old.vocab.ids)}
    mean = old_model.item_emb.weight[1:-1].mean(0)
    for n, item in enumerate(new.vocab.ids.tolist(), 1):  # every item of the new catalogue, by its ID
        want = old_model.item_emb.weight[old_rows[item]] if item in old_rows else mean
        torch.testing.assert_close(model.item_emb.weight[n], want)
        bias = old_model.out_bias[old_rows[item]] if item in old_rows else old_model.out_bias[1:-1].mean()
        torch.testing.assert_close(model.out_bias[n], bias)
    torch.testing.assert_close(model.item_emb.weight[-1], old_model.item_emb.weight[-1])  # the mask token's
    for key, value in old_model.state_dict().items():  # every other weight as it was
        if key not in ("item_emb.weight", "out_bias"):
            torch.testing.assert_close(model.state_dict()[key], value)


def test_a_warm_started_run_trains_and_names_the_run_it_started_from(catalogues, tmp_path):
    folders, old_run = catalogues
    args = ["train", "--model", "sasrec", "--data", str(folders["new"]), "--out", str(tmp_path / "run")]
    args += ["--epochs", "1", "--samples-per-user", "1", "--device", "cpu", "--warm-start", str(old_run)]
    args += [f"--{k}={v}" for k, v in SMALL.items()]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "run" / "run.json").read_text())["train"]["warm_start"] == str(old_run)
    record = json.loads((tmp_path / "run" / "metrics.json").read_text())["warm_start"]
    assert record == {"run": str(old_run.resolve()), "items_carried": 1400, "items_new": 182, "items_dropped": 100}


@pytest.mark.parametrize(
    ("model", "settings", "message"),
    [
        ("bert4rec", SMALL, "a sasrec run; this trains bert4rec"),
        ("sasrec", SMALL | {"window": 30}, "other settings than this run's (window 20 there, 30 here)"),
    ],
)
def test_a_run_of_another_model_or_settings_is_refused_in_one_line_before_anything_is_written(
    catalogues, tmp_path, model, settings, message
):
    folders, old_run = catalogues
    cfg = TrainConfig(epochs=1, device="cpu", warm_start=str(old_run))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        train(folders["new"], tmp_path / "run", settings, cfg, model=model)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="--warm-start: not a setting of multvae"):
        TrainConfig(warm_start=str(old_run)).check_model("multvae")
    np.testing.assert_array_equal(load_prepared(folders["new"]).vocab.ids[:3], [101, 102, 103])


def test_a_warm_started_runs_refit_starts_from_the_same_carried_weights(catalogues):
    """The refit (SASRec's default) trains a model again for the chosen epochs: from the warm start's weights
    where the run had them, as the run did (a next day's few epochs from random weights would lose the days
    before)."""
    from recserve.train.trainer import _refit

    folders, old_run = catalogues
    new = load_prepared(folders["new"])
    cfg = TrainConfig(epochs=1, samples_per_user=1, device="cpu", resume=False, warm_start=str(old_run), refit=True)
    start = _refit("sasrec", new, SMALL, cfg, epochs=0)  # no epoch: the weights the refit starts from
    model = load_run(old_run).__class__(SASRecConfig(num_items=new.vocab.num_items, **SMALL))
    carry_by_id(model, model.cfg, "sasrec", new.vocab.ids, old_run)
    assert start.keys() == model.state_dict().keys()
    assert all(torch.equal(start[name], value) for name, value in model.state_dict().items())
