"""Wraps a torch callable as the predictor's numpy runner, and fills in the business rules' inputs a caller
left out (every item allowed)."""

from __future__ import annotations

import numpy as np
import torch

from recserve.export.backend_protocol import Runner, rule_inputs


class DeviceMasks:
    """The masks' copy on the device, made again only when the caller hands other masks: a predictor hands the
    same read-only array batch after batch until its rules change (``recserve.rules.rule_book.RuleBook``)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.source: np.ndarray | None = None
        self.copy: torch.Tensor | None = None

    def __call__(self, masks: np.ndarray) -> torch.Tensor:
        if masks is not self.source or self.copy is None:
            self.source, self.copy = masks, torch.tensor(masks, device=self.device)  # read-only: copied
        return self.copy


def torch_runner(fn, device: str | torch.device, num_items: int) -> Runner:
    """A runner that moves inputs to ``device`` once, runs ``fn`` without autograd and returns numpy."""
    device = torch.device(device)
    on_device = DeviceMasks(device)

    def run(
        ids: np.ndarray,
        lengths: np.ndarray,
        exclude: np.ndarray,
        *rules: np.ndarray,
        k: int | None = None,
    ):
        masks, *rows = rule_inputs(num_items, len(ids), *rules)
        move = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device, non_blocking=True)  # noqa: E731
        with torch.inference_mode():
            top_ids, scores = fn(move(ids), move(lengths), move(exclude), on_device(masks), *map(move, rows))
            top_ids, scores = top_ids[:, :k], scores[:, :k]  # the graph selected max_k; copy back only k
        return top_ids.cpu().numpy(), scores.float().cpu().numpy()

    return run
