"""`recserve evaluate`'s one entry point: each model's test split and table, and metrics.json updated."""

import json

import pytest
from typer.testing import CliRunner

from recserve.cli.main import app
from recserve.constants import METRICS_FILE
from recserve.train.run_evaluation import HELD_OUT_USERS, LEAVE_ONE_OUT, split_of


def _evaluate(run, data) -> str:
    result = CliRunner().invoke(app, ["evaluate", "--run", str(run), "--data", str(data)])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_a_sequence_model_is_tested_leave_one_out_under_every_protocol(tiny_run, ml100k_dir, tmp_path):
    import shutil

    run = shutil.copytree(tiny_run, tmp_path / "run")  # the shared run stays untested (`recserve runs`'s test)
    assert split_of(run) is LEAVE_ONE_OUT
    output = _evaluate(run, ml100k_dir)
    assert "test split (leave-one-out)" in output and "sampled_uniform" in output
    metrics = json.loads((run / METRICS_FILE).read_text())
    assert set(metrics["test"]) == {"full", "served", "full_no_exclusion", "sampled", "sampled_uniform"}


def test_multvae_is_tested_on_held_out_users(vae_run, ml100k_implicit_dir):
    """The report's figures are the run's own test users' (its split drawn again from run.json's share and seed),
    every one of them and no training user: recomputed here on that fold, they agree."""
    import torch

    from recserve.data.datasets import load_prepared
    from recserve.models.run_loader import load_run
    from recserve.train.heldout import evaluate_fold, split_heldout

    assert split_of(vae_run) is HELD_OUT_USERS
    output = _evaluate(vae_run, ml100k_implicit_dir)
    assert "test split (held-out test users, 80% of items fed)" in output and "recall@20" in output
    reported = json.loads((vae_run / METRICS_FILE).read_text())["test"]["heldout"]
    settings = json.loads((vae_run / "run.json").read_text())["train"]
    data = load_prepared(ml100k_implicit_dir)
    split = split_heldout(data.sequences, settings["heldout_share"], seed=settings["seed"])
    assert reported["users"] == split.test.fed.num_users < data.sequences.num_users // 2
    model = load_run(vae_run).eval()
    with torch.no_grad():
        mine = evaluate_fold(model, split.test, model.cfg.vocab_size)
    for key in ("recall@20", "ndcg@100"):
        assert reported[key] == pytest.approx(mine[key], abs=1e-6), key


def test_multvae_is_refused_a_data_folder_of_the_same_catalogue_but_other_histories(
    vae_run, ml100k_implicit_dir, tmp_path
):

    from tests.conftest import other_histories

    from recserve.errors import DataError
    from recserve.train.heldout import evaluate_heldout_run

    with pytest.raises(DataError, match="not the data the run .* was trained on"):
        evaluate_heldout_run(vae_run, other_histories(ml100k_implicit_dir, tmp_path / "other"))
