"""The training step as a CUDA graph (run on a GPU machine; skipped elsewhere): replays train as the eager
steps do, draw new negatives each time, never wait for the host, and `recserve train` replays its steps.

It needs nothing of the serving stack: on a GPU machine without tritonclient, run it with
``python -m pytest --noconftest tests/gpu/test_graph_step_gpu.py`` (the last test needs polars).
"""

import numpy as np
import pytest
import torch

from recserve.bench.synthetic import zipf_sequences
from recserve.models import SASRec, SASRecConfig
from recserve.train.batches import NextItemSettings, WindowEpochs
from recserve.train.graph_step import WARM_UP_STEPS, GraphStep, ReplayedAdamW
from recserve.train.losses import CatalogueLoss
from recserve.train.objectives import next_item_loss
from recserve.train.train_config import LossSettings, TrainConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ITEMS = 20_000


def _training(captured: bool, compiled: bool = False):
    """A SASRec step as `recserve train` makes it on a GPU (sampled loss, bf16 autocast, ``compiled`` as
    --compile does), in a GraphStep that captures (``captured``) or steps eagerly throughout; its batches (each
    input a view of one window tensor, as next_item_batch makes them); the last negatives drawn."""
    objective = torch.compile(next_item_loss) if compiled else next_item_loss
    torch.manual_seed(0)
    seq = zipf_sequences(3_000, ITEMS, 30)
    cfg = SASRecConfig(num_items=ITEMS, window=50, dropout=0.0)
    model = SASRec(cfg).cuda()
    batches = WindowEpochs(seq, NextItemSettings(cfg.window, 0.0, cfg.mask_index), 512, 2, seed=0, device="cuda")
    settings = LossSettings("sampled-uniform", negatives=2_048).resolve(ITEMS)
    loss = CatalogueLoss(settings, np.bincount(seq.items, minlength=ITEMS + 2), cfg.mask_index, "cuda")
    generator = torch.Generator("cuda").manual_seed(1)
    drawn: dict[str, torch.Tensor] = {}

    def body(batch):
        with torch.autocast("cuda", torch.bfloat16, cache_enabled=False):
            drawn["negatives"] = loss.draw(generator)
            value = objective(model, batch, loss, drawn["negatives"])
        value.backward()
        return value.detach()

    step = GraphStep(body, ReplayedAdamW(list(model.parameters()), lr=1e-3), (generator,))
    step.failed = not captured  # a failed capture is never tried again: every step eager
    return model, step, batches, drawn


@pytest.mark.parametrize("compiled", [False, True])
def test_replayed_steps_train_as_eager_steps_do(compiled):
    """Seven full batches: three eager, then a capture and replays, against seven eager steps from the same
    start. The weights move alike (their difference a small share of how far each moved) and the losses
    agree; each replay draws new negatives (the generator registered with the graph)."""
    results = {}
    for captured in (True, False):
        model, step, batches, drawn = _training(captured, compiled)
        start = [p.detach().clone() for p in model.parameters()]
        losses, negatives = [], []
        for batch, _ in zip(batches, range(7)):
            losses.append(float(step(batch)))
            negatives.append(drawn["negatives"].clone())
        moved = [p.detach() - s for p, s in zip(model.parameters(), start)]
        results[captured] = losses, moved, negatives, step
    graphed, eager = results[True], results[False]
    assert graphed[3].replays == 7 - WARM_UP_STEPS and not graphed[3].failed
    assert eager[3].replays == 0 and eager[3].eager_steps == 7
    np.testing.assert_allclose(graphed[0], eager[0], rtol=2e-2)
    apart = torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(graphed[1], eager[1])))
    moved = torch.sqrt(sum((a**2).sum() for a in eager[1]))
    assert apart < 0.05 * moved, f"the replayed weights are {float(apart / moved):.3f} of the move away"
    replayed_draws = graphed[2][WARM_UP_STEPS:]
    assert all(not torch.equal(a, b) for a, b in zip(replayed_draws, replayed_draws[1:])), (
        "two replays drew the same negatives"
    )


def test_a_replayed_step_never_waits_for_the_gpu():
    """After the capture, building a batch and replaying the step send nothing from the GPU to the host:
    the host queues the next steps while the GPU works (every host sync an error)."""
    _, step, batches, _ = _training(True)
    stream = iter(batches)
    for _ in range(WARM_UP_STEPS + 1):
        step(next(stream))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(4):
            step(next(stream))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert step.replays == 5


def test_a_step_that_cannot_be_captured_steps_eagerly(caplog):
    """A step that reads the GPU from the host (here its loss, every step) cannot be captured: said once, and
    training goes on eagerly, its generators drawing as before (a capture left unfinished had broken them)."""
    model, step, batches, drawn = _training(True)
    body = step.body
    step.body = lambda batch: torch.as_tensor(float(body(batch)), device="cuda")
    losses = [float(step(batch)) for batch, _ in zip(batches, range(WARM_UP_STEPS + 3))]
    assert step.failed and step.replays == 0 and step.eager_steps == WARM_UP_STEPS + 3
    assert "its CUDA graph capture failed" in caplog.text
    assert losses[-1] < losses[0] and torch.rand(2, device="cuda").isfinite().all()


@pytest.mark.parametrize("model", ["sasrec", "bert4rec"])
def test_recserve_train_replays_its_steps_on_a_gpu(tmp_path, model):
    """`recserve train` on a GPU: after the warm-up every full batch is a replay (metrics' steps.cuda_graph),
    and the training loss falls from epoch to epoch."""
    from recserve.bench.synthetic import write_markov_log
    from recserve.data.datasets import prepare
    from recserve.train.trainer import train

    write_markov_log(tmp_path / "log.parquet", 4_000, 5_000, 30)
    prepare(str(tmp_path / "log.parquet"), tmp_path / "data")
    cfg = TrainConfig(epochs=3, device="cuda", batch_size=256, resume=False, patience=5)
    summary = train(tmp_path / "data", tmp_path / "run", {"window": 50, "hidden": 32}, cfg, model=model)
    graph = summary["steps"]["cuda_graph"]
    per_epoch = summary["steps"]["per_epoch"]
    assert not graph["capture_failed"]
    assert graph["replayed"] >= 3 * (per_epoch - 1) - WARM_UP_STEPS, graph
    assert graph["replayed"] + graph["eager"] == summary["steps"]["trained"]
    logged = [line.split(",") for line in (tmp_path / "run/logs/version_0/metrics.csv").read_text().splitlines()]
    column = logged[0].index("train_loss")
    losses = [float(row[column]) for row in logged[1:] if row[column]]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2], losses
