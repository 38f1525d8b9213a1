"""The optimizer of a graphed step (``train.graph_step.ReplayedAdamW``), on the CPU: what Lightning calls does
only what the graph leaves to it, the update is AdamW's own, and the schedule moves a learning rate the graph
reads. The capture and replays themselves need a GPU (tests/gpu/test_graph_step_gpu.py)."""

import io

import torch

from recserve.train.graph_step import ReplayedAdamW
from recserve.train.schedule import cosine_with_warmup


def _weights(seed: int = 0) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=generator)), torch.nn.Parameter(torch.zeros(3))]


def _gradients(weights, step: int) -> None:
    for i, w in enumerate(weights):
        w.grad = torch.full_like(w, 0.1 * (step + 1) * (i + 1))


def _train(steps: range, *runs) -> None:
    """Each step's gradients given to each run (weights, update), then its update."""
    for step in steps:
        for weights, update in runs:
            _gradients(weights, step)
            update()


def _resumed(optimizer: torch.optim.Optimizer, weights, fresh) -> ReplayedAdamW:
    """A ReplayedAdamW of ``fresh`` weights made equal to ``weights``, with ``optimizer``'s state loaded from
    its checkpoint (as a resumed run makes it)."""
    with torch.no_grad():
        for w, v in zip(fresh, weights):
            w.copy_(v)
    checkpoint = io.BytesIO()
    torch.save(optimizer.state_dict(), checkpoint)
    checkpoint.seek(0)
    resumed = ReplayedAdamW(fresh, lr=0.01)
    resumed.load_state_dict(torch.load(checkpoint, weights_only=True))
    return resumed


def test_lightnings_step_runs_the_closure_alone_and_the_update_is_adamws():
    """``step(closure)`` (what Lightning calls) runs the closure and moves no weight, ``zero_grad`` keeps the
    gradients (a replay writes over them); ``update`` moves the weights exactly as AdamW does."""
    ours, theirs = _weights(), _weights()
    replayed = ReplayedAdamW(ours, lr=0.01, weight_decay=0.1)
    plain = torch.optim.AdamW(theirs, lr=0.01, weight_decay=0.1)
    before = [w.detach().clone() for w in ours]
    calls = []
    _gradients(ours, 0)
    assert replayed.step(lambda: calls.append("closure") or "loss") == "loss" and calls == ["closure"]
    replayed.zero_grad()
    assert all(torch.equal(w, b) for w, b in zip(ours, before)) and all(w.grad is not None for w in ours)
    _train(range(3), (ours, replayed.update), (theirs, plain.step))
    for w, v in zip(ours, theirs):
        torch.testing.assert_close(w, v)


def test_the_schedule_fills_the_learning_rate_the_graph_reads():
    """The learning rate is one tensor for the run (a captured graph reads its memory); the cosine schedule
    fills it in place with the warm-up's and the cosine's values, from a float base rate."""
    weights = _weights()
    optimizer = ReplayedAdamW(weights, lr=0.02)
    rate = optimizer.param_groups[0]["lr"]
    schedule = cosine_with_warmup(optimizer, total_steps=40)
    assert isinstance(rate, torch.Tensor) and type(optimizer.param_groups[0]["initial_lr"]) is float
    seen = [float(rate)]
    for _ in range(39):
        optimizer.step(optimizer.update)  # as Lightning steps it: its closure replays the graph, which updates
        schedule.step()
        assert optimizer.param_groups[0]["lr"] is rate
        seen.append(float(rate))
    warmup = 40 // 20
    assert seen[0] == torch.tensor(0.02 * (1 / warmup)).item() and max(seen) <= 0.02 + 1e-9
    assert seen[-1] < seen[20] < seen[warmup], "not a cosine down after the warm-up"
    optimizer.param_groups[0]["lr"] = 0.005  # a schedule that sets a float (PyTorch before 2.6)
    optimizer.step(optimizer.update)
    assert optimizer.param_groups[0]["lr"] is rate and float(rate) == torch.tensor(0.005).item()


def test_a_resumed_optimizer_trains_on_as_the_uninterrupted_one():
    """A checkpoint's state loaded into a fresh optimizer (a resumed run): the same next updates, the learning
    rate still a tensor."""
    first, second = _weights(), _weights()
    running = ReplayedAdamW(first, lr=0.01)
    _train(range(2), (first, running.update))
    resumed = _resumed(running, first, second)
    assert isinstance(resumed.param_groups[0]["lr"], torch.Tensor)
    _train(range(2, 4), (first, running.update), (second, resumed.update))
    for w, v in zip(first, second):
        torch.testing.assert_close(w, v)


def test_an_eager_adamws_checkpoint_resumes_as_a_graphed_one():
    """A run begun eagerly (an AdamW with a float learning rate, neither fused nor capturable) and resumed with
    its steps graphed: the loaded groups keep the fused, capturable update and a learning-rate tensor (a capture
    of the eager update would fail), and training goes on as the eager optimizer's would."""
    first, second = _weights(), _weights()
    eager = torch.optim.AdamW(first, lr=0.01)
    _train(range(2), (first, eager.step))
    resumed = _resumed(eager, first, second)
    group = resumed.param_groups[0]
    assert group["fused"] and group["capturable"] and isinstance(group["lr"], torch.Tensor)
    assert group["lr"] is group["lr_tensor"] and float(group["lr"]) == torch.tensor(0.01).item()
    _train(range(2, 4), (first, eager.step), (second, resumed.update))
    for w, v in zip(first, second):
        torch.testing.assert_close(w, v)
