"""`recserve evaluate`'s one entry point: each model's test split and table, and metrics.json updated."""

import json

from typer.testing import CliRunner

from recserve.cli.main import app
from recserve.constants import METRICS_FILE
from recserve.train.run_evaluation import HELD_OUT_USERS, LEAVE_ONE_OUT, split_of


def _evaluate(run, data) -> str:
    result = CliRunner().invoke(app, ["evaluate", "--run", str(run), "--data", str(data)])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_a_sequence_model_is_tested_leave_one_out_under_every_protocol(tiny_run, ml100k_dir):
    assert split_of(tiny_run) is LEAVE_ONE_OUT
    output = _evaluate(tiny_run, ml100k_dir)
    assert "test split (leave-one-out)" in output and "sampled_uniform" in output
    metrics = json.loads((tiny_run / METRICS_FILE).read_text())
    assert set(metrics["test"]) == {"full", "served", "full_no_exclusion", "sampled", "sampled_uniform"}


def test_multvae_is_tested_on_held_out_users(vae_run, ml100k_implicit_dir):
    assert split_of(vae_run) is HELD_OUT_USERS
    output = _evaluate(vae_run, ml100k_implicit_dir)
    assert "test split (held-out test users, 80% of items fed)" in output and "recall@20" in output
    assert "heldout" in json.loads((vae_run / METRICS_FILE).read_text())["test"]
