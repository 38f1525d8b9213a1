"""A training step that the GPU runs alone: the sampled loss's negatives drawn, the forward, the backward and
AdamW's update captured as one CUDA graph and replayed each step, so that a step costs the host one copy of
the batch and one launch, whatever the host's CPU (PyTorch's whole-network capture: warm-up steps on a side
stream, a capture into a private pool, replays on static tensors).

Shapes must repeat for a replay: every batch of an epoch has the same rows and scored slots on a GPU
(``batches.WindowEpochs``' capacity), but the last batch of an epoch is shorter and steps eagerly, as do the
first ``WARM_UP_STEPS`` (torch.compile and cuBLAS settle there). A capture that fails is said once in the log
and the run goes on stepping eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import fields, replace
from typing import cast

import torch

log = logging.getLogger(__name__)

WARM_UP_STEPS = 3  # eager steps (on a side stream) before the capture


class ReplayedAdamW(torch.optim.AdamW):
    """AdamW for a step the module makes itself (``GraphStep``): Lightning's ``step(closure)`` runs the
    closure alone, as its ``zero_grad`` does nothing; ``update`` is AdamW's own step, which the graph holds.

    Capturable and fused, with its learning rate a tensor on the device that a schedule fills in place (a
    captured graph reads a float learning rate once, at its capture)."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float, **kwargs):
        lr_tensor = torch.tensor(lr, device=params[0].device)
        super().__init__(params, lr=lr_tensor, fused=True, capturable=True, **kwargs)
        for group in self.param_groups:  # the schedule's base rate a float: its updates then never read the GPU
            group["initial_lr"] = float(lr)
            group["lr_tensor"] = group["lr"]

    def load_state_dict(self, state_dict: dict) -> None:
        """A checkpoint's state, an eager AdamW's too (a run begun eagerly and resumed with its steps graphed):
        the groups keep this optimizer's fused, capturable update and a learning-rate tensor on the device, which
        the loaded groups would otherwise replace."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group["fused"] = group["capturable"] = True
            rate = torch.as_tensor(group["lr"], dtype=torch.float32, device=group["params"][0].device)
            group["lr"] = group["lr_tensor"] = rate

    def step(self, closure: Callable | None = None):
        for group in self.param_groups:
            if not isinstance(group["lr"], torch.Tensor):  # a schedule that sets a float (PyTorch before 2.6)
                group["lr"] = group["lr_tensor"].fill_(group["lr"])  # into the tensor the graph reads: no GPU read
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing: a replay writes the gradients over the last ones (``GraphStep`` zeroes them for an eager step)."""

    def update(self) -> None:
        super().step()


class GraphStep:
    """Runs ``body(batch)`` (the loss's forward and backward; it returns the loss) and the optimizer's update as
    one step: eagerly for the first ``WARM_UP_STEPS`` and for any batch of another shape, else as the replay
    of a graph captured on the first batch of the usual shape.

    Args:
        body: the step's forward and backward on a batch (a dataclass of tensors); it returns the loss.
        optimizer: the ``ReplayedAdamW`` whose update the step ends with.
        generators: the generators the body draws from, registered with the graph so that each replay draws anew.
    """

    def __init__(self, body: Callable, optimizer: ReplayedAdamW, generators: tuple[torch.Generator, ...] = ()):
        self.body, self.optimizer, self.generators = body, optimizer, generators
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static = None  # the batch the graph reads, and the loss it writes
        self.loss: torch.Tensor | None = None
        self.eager_steps, self.replays, self.failed = 0, 0, False
        self.stream = torch.cuda.Stream()  # the eager steps', off the default stream as a capture wants them

    def __call__(self, batch) -> torch.Tensor:
        """One step on ``batch``; returns its loss (a replay's is the graph's own tensor, valid until the next)."""
        # every step's tensors contiguous (a batch's may be views): torch.compile then sees one layout, and a
        # capture never meets a layout its warm-up did not compile for (a recompile in a capture ends it)
        batch = _each(batch, torch.Tensor.contiguous)
        if self.graph is None and not self.failed and self.eager_steps >= WARM_UP_STEPS:
            self._capture(batch)
        if self.graph is not None and _shapes(batch) == _shapes(self.static):
            _copy_into(self.static, batch)
            self.graph.replay()
            self.replays += 1
            return cast(torch.Tensor, self.loss)
        return self._eager(batch)

    def _eager(self, batch) -> torch.Tensor:
        self.eager_steps += 1
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            for p in self.params():
                if p.grad is not None:
                    p.grad.zero_()
            loss = self.body(batch)
            self.optimizer.update()
        torch.cuda.current_stream().wait_stream(self.stream)
        return loss

    def _capture(self, batch) -> None:
        """Captures the step on a copy of ``batch`` (the capture runs nothing: the caller's replay is this batch's
        step); where the capture fails, says so once and leaves the steps eager."""
        self.static = _each(batch, torch.Tensor.clone)
        for p in self.params():  # the backward in the graph then writes its gradients, never adds to them
            p.grad = None
        graph = torch.cuda.CUDAGraph()
        # the generators a capture draws from (the default one for dropout): restored where the capture fails,
        # as a capture left unfinished leaves them refusing every later draw
        generators = (*self.generators, torch.cuda.default_generators[torch.cuda.current_device()])
        states: list = []
        try:
            states = [(g, g.clone_state()) for g in generators]
            for generator in self.generators:
                graph.register_generator_state(generator)
            torch.cuda.synchronize()
            with torch.cuda.graph(graph):
                self.loss = self.body(self.static)
                self.optimizer.update()
        except Exception as err:  # a capture's errors have no common base class
            self.failed, self.static = True, None
            log.warning("the training step runs uncaptured (eager): its CUDA graph capture failed (%s)", err)
            for generator, state in states:
                generator.graphsafe_set_state(state)
            torch.cuda.synchronize()
            return
        self.graph = graph

    def params(self):
        return (p for group in self.optimizer.param_groups for p in group["params"])


def _each(batch, change: Callable[[torch.Tensor], torch.Tensor]):
    """``batch`` (a dataclass of tensors) with ``change`` made to each of its tensors."""
    return replace(batch, **{f.name: change(getattr(batch, f.name)) for f in fields(batch)})


def _shapes(batch) -> tuple:
    return tuple(getattr(batch, f.name).shape for f in fields(batch))


def _copy_into(static, batch) -> None:
    for f in fields(batch):
        getattr(static, f.name).copy_(getattr(batch, f.name), non_blocking=True)
