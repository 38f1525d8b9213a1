"""Training end to end: it learns a planted pattern, is deterministic, and refuses bad settings."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

from recserve.constants import ITEM_TABLE_FILE, METRICS_FILE, MODEL_CONFIG_FILE, VALIDATED_WEIGHTS_FILE, WEIGHTS_FILE
from recserve.errors import ConfigError, DataError, EvaluationError
from recserve.models.run_loader import load_run
from recserve.train.curves import curves
from recserve.train.leave_one_out import evaluate_run
from recserve.train.run_evaluation import evaluate_test
from recserve.train.trainer import TrainConfig, train

SMALL = {"window": 8, "hidden": 32, "layers": 1, "heads": 2, "dropout": 0.1}


def test_training_learns_a_planted_sequence_and_beats_popularity(string_data_dir, tmp_path):
    cfg = TrainConfig(epochs=25, samples_per_user=8, batch_size=64, lr=3e-3, patience=25, device="cpu", resume=False)
    summary = train(string_data_dir, tmp_path / "run", SMALL, cfg, model="bert4rec")
    for name in (WEIGHTS_FILE, MODEL_CONFIG_FILE, ITEM_TABLE_FILE, "curves.png"):
        assert (tmp_path / "run" / name).exists(), name
    result = evaluate_run(tmp_path / "run", string_data_dir)
    # every user walks the same cycle, so the next item is fully predictable from the last one
    assert result["test"]["full"]["hr@1"] > 0.5
    assert result["test"]["full"]["ndcg@10"] > 3 * result["popularity"]["full"]["ndcg@10"]
    assert summary["valid"]["ndcg@10"] > 0.5
    series = curves(tmp_path / "run" / "logs" / "version_0" / "metrics.csv")  # what curves.png draws
    epochs, loss = series["train_loss"]
    assert list(epochs) == list(range(1, 26)) and list(series["val_ndcg@10"][0]) == list(range(1, 26))
    # the epoch's mean step loss: at most the uniform guess's cross-entropy over 30 items at first, then falling
    assert loss[0] < 1.2 * np.log(30) and loss[-1] < 0.5 * loss[0]


def test_sasrec_learns_the_planted_sequence_too(string_data_dir, tmp_path):
    cfg = TrainConfig(epochs=25, samples_per_user=4, batch_size=64, lr=3e-3, patience=25, device="cpu", resume=False)
    summary = train(string_data_dir, tmp_path / "run", SMALL, cfg, model="sasrec")
    result = evaluate_run(tmp_path / "run", string_data_dir)
    assert result["test"]["full"]["hr@1"] > 0.5
    assert result["test"]["full"]["ndcg@10"] > 3 * result["popularity"]["full"]["ndcg@10"]
    assert summary["model"] == "sasrec" and summary["loss"]["name"] == "full"


def test_a_time_budget_stops_training_and_keeps_the_best_validated_weights(string_data_dir, tmp_path):
    """--max-minutes: 250 epochs asked, a budget of 3 s ends them, and the run is whole (weights, metrics)."""
    cfg = TrainConfig(epochs=250, patience=250, samples_per_user=4, batch_size=64, device="cpu", max_minutes=0.05)
    summary = train(string_data_dir, tmp_path / "run", SMALL, cfg, model="sasrec")
    assert summary["budget_ended"] and 0 <= summary["best_epoch"] < 249
    assert (tmp_path / "run" / WEIGHTS_FILE).exists()
    unbounded = train(string_data_dir, tmp_path / "two", SMALL, dataclasses.replace(cfg, epochs=1, max_minutes=0))
    assert not unbounded["budget_ended"]


def test_patience_and_a_budget_in_steps_whatever_an_epochs_size(string_data_dir, tmp_path):
    """--max-steps ends training at that step (mid-epoch too) with the run whole; --patience-steps is whole
    epochs of the run's size, never fewer than --patience; the last epoch's speed and the host are recorded."""
    cfg = TrainConfig(epochs=50, patience=50, samples_per_user=4, batch_size=64, device="cpu", resume=False)
    one = train(string_data_dir, tmp_path / "one", SMALL, dataclasses.replace(cfg, epochs=1), model="sasrec")
    per_epoch = one["steps"]["per_epoch"]
    assert one["steps"]["trained"] == per_epoch > 1 and not one["budget_ended"]
    summary = train(string_data_dir, tmp_path / "run", SMALL, dataclasses.replace(cfg, max_steps=2 * per_epoch + 1))
    assert summary["budget_ended"] and summary["steps"]["trained"] == 2 * per_epoch + 1
    assert summary["best_epoch"] <= 2 and (tmp_path / "run" / WEIGHTS_FILE).exists()
    speed = one["speed"]  # what the run's speed depends on, recorded beside it
    assert speed["epoch_s"] > 0 and speed["steps_per_s"] > 0 and speed["gpu_busy_pct"] is None
    assert speed["host"]["cpu"] and speed["host"]["cores"] >= 1 and speed["host"]["gpu"] is None
    steps = dataclasses.replace(cfg, patience=2, patience_steps=5 * per_epoch - 1)
    assert steps.patience_epochs(per_epoch) == 5 and steps.patience_epochs(10 * per_epoch) == 2
    assert dataclasses.replace(steps, patience_steps=0).patience_epochs(per_epoch) == 2


def test_a_model_that_diverges_stops_training_naming_the_epoch_and_keeps_no_nan_checkpoint(string_data_dir, tmp_path):
    import lightning as L

    class Diverge(L.Callback):  # what a learning rate far too high does, in the second epoch
        def on_train_batch_end(self, trainer, module, *args):
            if trainer.current_epoch == 1:
                with torch.no_grad():
                    module.model.item_emb.weight.fill_(float("nan"))

    cfg = TrainConfig(epochs=4, samples_per_user=1, patience=4, device="cpu", resume=False)
    with pytest.raises(EvaluationError, match="validation after epoch 2: .* NaN or infinite score"):
        train(string_data_dir, tmp_path / "run", SMALL, cfg, callbacks=[Diverge()], model="bert4rec")
    best = torch.load(tmp_path / "run" / "checkpoints" / "best.ckpt", weights_only=True)
    assert best["epoch"] == 0 and not (tmp_path / "run" / WEIGHTS_FILE).exists()
    assert all(torch.isfinite(v).all() for v in best["state_dict"].values())


@pytest.mark.parametrize("model", ["bert4rec", "sasrec"])
def test_same_seed_gives_the_same_weights(string_data_dir, tmp_path, model):
    """A rerun of a seed on the CPU is the same run: the data's order, BERT4Rec's masks and the dropout are all
    drawn from the seed (on a GPU the embeddings' backward adds with atomics, whose order varies run to run)."""
    cfg = TrainConfig(epochs=2, samples_per_user=2, device="cpu", resume=False)
    for name in ("a", "b"):
        train(string_data_dir, tmp_path / name, SMALL, cfg, model=model)
    a, b = load_run(tmp_path / "a").state_dict(), load_run(tmp_path / "b").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_tiny_run_writes_metrics_with_both_protocols(tiny_run, ml100k_dir):
    result = evaluate_run(tiny_run, ml100k_dir)
    assert set(result["test"]) == {"full", "served", "full_no_exclusion", "sampled", "sampled_uniform"}
    # excluding seen items moves targets up: strictly, on ML-100K's long histories (equal if it were skipped);
    # serving excludes only the window's items, so some older ones still compete there
    test = result["test"]
    assert test["full"]["mrr"] > test["served"]["mrr"] > test["full_no_exclusion"]["mrr"]
    repeats = result["repeated_targets"]
    assert repeats["users"] == 943 and 0 <= repeats["in_served_window"] <= repeats["earlier_in_history"]
    assert result["popularity"]["full"]["hr@10"] == pytest.approx(0.0859, abs=0.003)  # exact-count popularity
    assert json.loads((tiny_run / METRICS_FILE).read_text())["model"] == "bert4rec"


@pytest.mark.parametrize(
    ("model", "cfg", "error", "message"),
    [
        ({"window": 1}, {}, ConfigError, "window=1"),
        ({}, {"device": "cuda"}, ConfigError, "no CUDA device"),
        ({}, {"device": "tpu"}, ConfigError, "expected auto, cpu or cuda"),
        ({}, {"epochs": 0}, ConfigError, "epochs=0"),
        ({}, {"input_mask": 1.0}, ConfigError, "input_mask=1.0"),
        ({}, {"input_mask": 0.2}, ConfigError, "--input-mask: not a setting of bert4rec"),
        ({}, {"label_smoothing": 1.5}, ConfigError, "label_smoothing=1.5"),
        ({}, {"max_minutes": -1.0}, ConfigError, "max_minutes=-1.0"),
        ({}, {"max_minutes": float("nan")}, ConfigError, "max_minutes=nan"),
        ({}, {"patience_steps": -1}, ConfigError, "patience_steps=-1"),
        ({}, {"max_steps": -5}, ConfigError, "max_steps=-5"),
    ],
)
def test_bad_settings_get_one_clear_error(ml100k_dir, tmp_path, model, cfg, error, message):
    if cfg.get("device") == "cuda" and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(error, match=message):
        train(ml100k_dir, tmp_path / "run", model, TrainConfig(**cfg), model="bert4rec")


def test_a_folder_that_is_not_prepared_data_is_refused(tmp_path):
    with pytest.raises(DataError, match="not a prepared data folder"):
        train(tmp_path, tmp_path / "run")


def test_data_from_another_format_version_is_refused(ml100k_dir, tmp_path):
    import shutil

    shutil.copytree(ml100k_dir, tmp_path / "old")
    info = json.loads((tmp_path / "old" / "dataset.json").read_text())
    (tmp_path / "old" / "dataset.json").write_text(json.dumps(info | {"format_version": 0}))
    with pytest.raises(DataError, match="format version 0"):
        train(tmp_path / "old", tmp_path / "run")


def test_evaluating_on_another_dataset_is_refused(tiny_run, string_data_dir):
    with pytest.raises(DataError, match="trained on 1682"):
        evaluate_run(tiny_run, string_data_dir)


def test_a_data_folder_of_the_same_catalogue_but_other_histories_is_refused(tiny_run, ml100k_dir, tmp_path):
    """The same items and users, one history a first item short: the item count agrees, the fingerprint not."""
    from tests.conftest import other_histories

    with pytest.raises(DataError, match="not the data the run .* was trained on .*interactions 100000 there, 99999"):
        evaluate_run(tiny_run, other_histories(ml100k_dir, tmp_path / "other"))


def test_a_run_without_its_record_is_evaluated_with_a_warning_the_report_keeps(tiny_run, ml100k_dir, tmp_path, caplog):
    shutil.copytree(tiny_run, tmp_path / "run")
    (tmp_path / "run" / "run.json").unlink()
    with caplog.at_level("WARNING"):
        report = evaluate_run(tmp_path / "run", ml100k_dir)
    assert report["data_check"].startswith("unchecked: the run has no run.json")
    assert "cannot be checked" in caplog.text
    assert evaluate_run(tiny_run, ml100k_dir)["data_check"] == "the data folder's fingerprint is the run's"


def test_a_heldout_run_without_its_split_recorded_is_refused(vae_run, ml100k_implicit_dir, tmp_path):
    from recserve.train.heldout import evaluate_heldout_run

    shutil.copytree(vae_run, tmp_path / "run")
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    del record["train"]["seed"]
    (tmp_path / "run" / "run.json").write_text(json.dumps(record))
    with pytest.raises(DataError, match="seed not recorded, so the run's test users cannot be drawn again"):
        evaluate_heldout_run(tmp_path / "run", ml100k_implicit_dir)


def test_the_kept_weights_are_the_average_and_a_refit_keeps_its_average_too(string_data_dir, tmp_path):
    """With the weights' average (SASRec's default), the best checkpoint holds the average beside the current
    weights and model.pt is the average; a refit trains with the average as well, so its weights differ from
    the same refit without it."""
    cfg = TrainConfig(epochs=2, samples_per_user=2, patience=3, device="cpu", resume=False, ema_epochs=10.0)
    train(string_data_dir, tmp_path / "run", SMALL, cfg, model="sasrec")
    best = torch.load(tmp_path / "run" / "checkpoints" / "best.ckpt", weights_only=True)
    kept = torch.load(tmp_path / "run" / WEIGHTS_FILE, weights_only=True)
    current = best["current_model_state"]  # the weights training went on from
    assert torch.equal(kept["item_emb.weight"], best["state_dict"]["model.item_emb.weight"])
    assert not torch.equal(kept["item_emb.weight"], current["model.item_emb.weight"])
    refits = {}
    for ema in (10.0, 0.0):
        refit = dataclasses.replace(cfg, refit=True, ema_epochs=ema)
        train(string_data_dir, tmp_path / f"refit-{ema}", SMALL, refit, model="sasrec")
        refits[ema] = torch.load(tmp_path / f"refit-{ema}" / WEIGHTS_FILE, weights_only=True)["item_emb.weight"]
    assert not torch.equal(refits[10.0], refits[0.0])


def test_metric_of_sampled_protocol_is_reproducible(tiny_run, ml100k_dir):
    a = evaluate_run(tiny_run, ml100k_dir, seed=3)["test"]["sampled"]
    b = evaluate_run(tiny_run, ml100k_dir, seed=3)["test"]["sampled"]
    assert a == b and np.isfinite(list(a.values())).all()


def test_refit_trains_again_on_the_validation_item_for_the_chosen_epochs(string_data_dir, tmp_path):
    """The refit's own training sequences are each user's items but the test one: the validation item in, the
    test item never (a refit that trained on the test item would report a test it had seen)."""
    from recserve.data.datasets import load_prepared
    from recserve.train.lightning_modules import build_task

    data = load_prepared(string_data_dir)
    refit = build_task("bert4rec", data, SMALL, TrainConfig(device="cpu"), refit=True).module.train_seq
    first = build_task("bert4rec", data, SMALL, TrainConfig(device="cpu")).module.train_seq
    for user in range(data.sequences.num_users):
        items = data.sequences.items[data.sequences.offsets[user] : data.sequences.offsets[user + 1]]
        refitted = refit.items[refit.offsets[user] : refit.offsets[user + 1]]
        assert refitted.tolist() == items[:-1].tolist()  # the validation item included, the test item not
        assert first.items[first.offsets[user] : first.offsets[user + 1]].tolist() == items[:-2].tolist()
    cfg = TrainConfig(epochs=3, samples_per_user=2, patience=3, device="cpu", resume=False, refit=True)
    summary = train(string_data_dir, tmp_path / "run", SMALL, cfg, model="bert4rec")
    assert summary["refit"]["epochs"] == summary["best_epoch"] + 1 and summary["refit"]["seconds"] >= 0
    selected = torch.load(tmp_path / "run" / "checkpoints" / "best.ckpt", weights_only=True)["state_dict"]
    kept = torch.load(tmp_path / "run" / WEIGHTS_FILE, weights_only=True)
    assert set(kept) == {k.removeprefix("model.") for k in selected}
    assert not torch.equal(kept["item_emb.weight"], selected["model.item_emb.weight"])  # a new model was kept
    # the weights validation chose stay beside it, and the test ranks with both: what the refit bought
    validated = torch.load(tmp_path / "run" / VALIDATED_WEIGHTS_FILE, weights_only=True)
    assert all(torch.equal(validated[name], selected[f"model.{name}"]) for name in kept)
    result = evaluate_test(tmp_path / "run", string_data_dir)
    assert result["test_validated"].keys() == result["test"].keys()
    assert result["test_validated"]["full"] != result["test"]["full"]
    alone = evaluate_run(tmp_path / "run", string_data_dir, weights=VALIDATED_WEIGHTS_FILE)
    assert result["test_validated"] == alone["test"]  # every protocol: one ranker, the same negatives drawn


@pytest.mark.parametrize(
    ("cfg", "message"),
    [({"label_smoothing": 0.1}, "--label-smoothing: not a setting of multvae"), ({"input_mask": 0.1}, "--input-mask")],
)
def test_sequence_models_options_are_refused_for_multvae(ml100k_implicit_dir, tmp_path, cfg, message):
    with pytest.raises(ConfigError, match=message):
        train(ml100k_implicit_dir, tmp_path / "run", {}, TrainConfig(**cfg), model="multvae")
    assert not (tmp_path / "run").exists()


def test_refit_is_refused_for_multvae(ml100k_implicit_dir, tmp_path):
    cfg = TrainConfig(epochs=1, device="cpu", resume=False, refit=True)
    with pytest.raises(ConfigError, match="only BERT4Rec and SASRec can be refitted"):
        train(ml100k_implicit_dir, tmp_path / "run", {}, cfg, model="multvae")
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_the_weights_average_spans_the_epochs_asked_whatever_its_update_interval():
    """An EMA over ``ema_epochs`` epochs: updated every step on small epochs, every 10 steps on large ones
    (each update syncs with the GPU), its decay matched so that the horizon stays ema_epochs epochs."""
    from recserve.train.trainer import _averaging

    assert _averaging(TrainConfig(ema_epochs=0.0), "sasrec", 800) == []
    (small,) = _averaging(TrainConfig(ema_epochs=1.0), "sasrec", 15)
    (large,) = _averaging(TrainConfig(ema_epochs=2.0), "sasrec", 800)
    assert small.update_every_n_steps == 1 and large.update_every_n_steps == 10
    # one update moves the average 1 / (updates in the horizon) of the way: 2 epochs x 800 steps / 10
    moved = large._kwargs["avg_fn"](torch.zeros(1), torch.ones(1), torch.tensor(1))
    assert float(moved) == pytest.approx(10 / (2.0 * 800))
    assert float(small._kwargs["avg_fn"](torch.zeros(1), torch.ones(1), torch.tensor(1))) == pytest.approx(1 / 15)
    with pytest.raises(ConfigError, match="ema-epochs: not a setting of multvae"):
        _averaging(TrainConfig(ema_epochs=1.0), "multvae", 100)
