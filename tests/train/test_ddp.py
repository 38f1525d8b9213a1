"""DDP on CPU (two processes, gloo): each rank trains on its own share of every batch, and together they
take the same steps as one process."""

import csv
import json
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import torch

from recserve.constants import WEIGHTS_FILE
from recserve.train.lightning_modules import fused_on
from recserve.train.trainer import TrainConfig

PROBE = textwrap.dedent('''
    """Trains through recserve's trainer and writes the tokens of every batch each rank trained on, and its loss."""
    import json, os, sys
    from recserve.train import lightning_modules
    from recserve.train.trainer import TrainConfig, train

    data, out, devices = sys.argv[1], sys.argv[2], int(sys.argv[3])
    seen, losses = [], []
    step = lightning_modules.SequenceModule.training_step

    def recording_step(self, batch, index):
        seen.append(batch.tokens.tolist())
        loss = step(self, batch, index)
        losses.append(loss.item())
        return loss

    lightning_modules.SequenceModule.training_step = recording_step
    cfg = TrainConfig(epochs=1, batch_size=16, samples_per_user=2, device="cpu", devices=devices)
    train(data, out, {"window": 8, "hidden": 16, "dropout": 0.0}, cfg, model="bert4rec")
    rank = os.environ.get("LOCAL_RANK", "0")
    with open(f"{out}/batches-rank{rank}.json", "w") as f:
        json.dump({"batches": seen, "losses": losses}, f)
''')


def _one_and_two(probe_text: str, data, tmp, record: str) -> tuple[Any, list[Any]]:
    """Runs the probe as one process (into tmp/one) and as two (tmp/two); returns what it recorded in
    ``record``-rank{N}.json: the one process's, and each of the two ranks'."""
    probe = tmp / "probe.py"
    probe.write_text(probe_text)
    for out, devices in (("one", 1), ("two", 2)):
        result = subprocess.run(
            [sys.executable, str(probe), str(data), str(tmp / out), str(devices)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
    whole = json.loads((tmp / "one" / f"{record}-rank0.json").read_text())
    return whole, [json.loads((tmp / "two" / f"{record}-rank{r}.json").read_text()) for r in (0, 1)]


def test_two_processes_split_every_batch_and_match_one_process(string_data_dir, tmp_path):
    whole, ranks = _one_and_two(PROBE, string_data_dir, tmp_path, "batches")
    assert len(whole["batches"]) == len(ranks[0]["batches"]) == len(ranks[1]["batches"]) == 8  # 120 windows, 16 a step
    for step, batch in enumerate(whole["batches"]):
        share0, share1 = ranks[0]["batches"][step], ranks[1]["batches"][step]
        assert share0 == batch[0::2] and share1 == batch[1::2]  # each rank its own rows, none twice
        assert len(share0) + len(share1) == len(batch)
    one = torch.load(tmp_path / "one" / WEIGHTS_FILE, weights_only=True)
    two = torch.load(tmp_path / "two" / WEIGHTS_FILE, weights_only=True)
    moved = one["item_emb.weight"] - two["item_emb.weight"]
    assert not torch.equal(one["item_emb.weight"], torch.zeros_like(moved))
    for name in one:
        np.testing.assert_allclose(two[name].numpy(), one[name].numpy(), atol=2e-4, rtol=1e-3, err_msg=name)
    # each rank validated half of the users; the logged metric is the mean over all of them
    assert _logged(tmp_path / "two") == pytest.approx(_logged(tmp_path / "one"), abs=0.01)
    # the logged training loss is the mean of every step's loss on both ranks, not rank 0's alone
    mean0, mean1 = (np.mean(rank["losses"]) for rank in ranks)
    assert _logged(tmp_path / "two", "train_loss") == pytest.approx((mean0 + mean1) / 2, rel=1e-5)
    assert abs(mean0 - mean1) > 1e-6  # the ranks' own losses differ (their rows do), so the mean says something
    assert _logged(tmp_path / "one", "train_loss") == pytest.approx(np.mean(whole["losses"]), rel=1e-5)


def _logged(run, metric: str = "val_ndcg@10") -> float:
    """The first value of ``metric`` in the run's Lightning CSV log."""
    rows = list(csv.DictReader((run / "logs" / "version_0" / "metrics.csv").open()))
    return float(next(row[metric] for row in rows if row.get(metric)))


VAE_PROBE = textwrap.dedent('''
    """Trains Mult-VAE through recserve's trainer and writes how many validation users each rank scored."""
    import json, os, sys
    from recserve.train import lightning_modules
    from recserve.train.trainer import TrainConfig, train

    data, out, devices = sys.argv[1], sys.argv[2], int(sys.argv[3])
    scored = []
    evaluate = lightning_modules.evaluate_fold

    def recording_evaluate(score_fn, fold, *args, **kwargs):
        scored.append(fold.fed.num_users)
        return evaluate(score_fn, fold, *args, **kwargs)

    lightning_modules.evaluate_fold = recording_evaluate
    cfg = TrainConfig(epochs=1, batch_size=16, device="cpu", devices=devices, seed=0)
    train(data, out, {"hidden": 16, "latent": 8}, cfg, model="multvae")
    rank = os.environ.get("LOCAL_RANK", "0")
    with open(f"{out}/scored-rank{rank}.json", "w") as f:
        json.dump(scored, f)
''')


def test_two_processes_each_validate_half_of_the_multvae_users_and_log_the_whole_mean(string_data_dir, tmp_path):
    whole, halves = _one_and_two(VAE_PROBE, string_data_dir, tmp_path, "scored")
    assert whole[-1] == halves[0][-1] + halves[1][-1] and abs(halves[0][-1] - halves[1][-1]) <= 1
    one, two = (_logged(tmp_path / run, "val_ndcg@100") for run in ("one", "two"))
    assert two == pytest.approx(one, abs=0.02) and one > 0


def test_the_ddp_strategy_writes_gradients_into_its_buckets_and_sends_bf16_only_from_bf16_gpus():
    from lightning.pytorch.strategies import DDPStrategy

    strategy = TrainConfig(device="cpu", devices=2).strategy()
    assert isinstance(strategy, DDPStrategy)
    assert strategy._ddp_kwargs["gradient_as_bucket_view"]  # no copy of the item table's gradient a step
    assert strategy._ddp_comm_hook is None  # float32 on CPUs
    assert TrainConfig(device="cpu", devices=1).strategy() == "auto"


def test_adam_is_fused_on_gpus_only():
    assert fused_on(torch.device("cuda", 0)) == {"fused": True}
    assert fused_on(torch.device("cpu")) == {}
