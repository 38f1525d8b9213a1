"""benchmarks/inference_views.py: a trained run ranked with the mean of its queries over views of each history
(items left out), beside the run as it is."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
SCRIPT = BENCHMARKS / "inference_views.py"


def _views_module():
    spec = importlib.util.spec_from_file_location("inference_views", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_view_leaves_out_more_the_later_it_comes_and_never_the_newest_item():
    views = _views_module()
    gone = views.left_out(8, 0.6, 200)
    assert gone.shape == (7, 200) and not gone[:, -1].any()
    shares = gone.float().mean(1)
    assert shares[0] < 0.2 and 0.4 < shares[-1] < 0.8  # 0.6 / 7 of the positions, then 0.6 of them
    assert torch.equal(gone, views.left_out(8, 0.6, 200))  # a fixed pattern: a served graph could hold it


def test_views_of_a_history_of_one_item_are_that_history(sasrec_run):
    from recserve.models.run_loader import load_run

    views = _views_module()
    plain = load_run(sasrec_run)
    plain.prepare_inference()
    tokens = torch.zeros(3, plain.cfg.window, dtype=torch.long)
    tokens[:, -1] = plain.cfg.mask_index
    tokens[:, -2] = torch.tensor([5, 17, 40])  # only the newest item, which no view leaves out
    longer = tokens.clone()
    longer[:, :-2] = torch.arange(100, 100 + plain.cfg.window - 2)  # a full window
    for mode in views.MODES:
        viewed = views.with_views(load_run(sasrec_run), mode, 4, 0.5)
        viewed.prepare_inference()
        with torch.no_grad():
            torch.testing.assert_close(viewed.query(tokens), plain.query(tokens))
            assert not torch.allclose(viewed.query(longer), plain.query(longer))


def test_the_benchmark_ranks_the_run_as_evaluate_does_then_with_its_views(
    sasrec_run, ml100k_dir, string_data_dir, tmp_path
):
    from recserve.train.leave_one_out import evaluate_run

    out = tmp_path / "views.jsonl"
    command = [sys.executable, str(SCRIPT), "--data", str(ml100k_dir), "--runs", str(sasrec_run), "--out", str(out)]
    result = subprocess.run([*command, "--variants", "pad:4:0.3,remove:4:0.3"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["variant"] for r in rows] == ["plain", "pad-v4-d0.3", "remove-v4-d0.3"]
    assert rows[0]["test"]["full"] == pytest.approx(evaluate_run(sasrec_run, ml100k_dir)["test"]["full"])
    assert rows[1]["test"]["full"] != rows[0]["test"]["full"] != rows[2]["test"]["full"]
    table = subprocess.run(
        [sys.executable, str(BENCHMARKS / "train_seeds.py"), "--tabulate", str(out), "--baseline", f"{out}:plain"],
        capture_output=True,
        text=True,
    )
    assert table.returncode == 0, table.stderr[-3000:]
    assert "| pad-v4-d0.3 | 0 |" in table.stdout

    bad = subprocess.run([*command, "--variants", "pad:1:0.3"], capture_output=True, text=True)
    assert bad.returncode != 0 and "VIEWS 2 or more" in bad.stderr
    other = [*command[:3], str(string_data_dir), *command[4:]]  # data the run was not trained on
    bad = subprocess.run(other, capture_output=True, text=True)
    assert bad.returncode != 0 and "the data folder it was trained on" in bad.stderr
