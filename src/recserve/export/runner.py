"""Wraps a torch callable as the predictor's numpy runner, and fills in the business rules' inputs a caller
left out (every item allowed)."""

from __future__ import annotations

import numpy as np
import torch

from recserve.export.backend_protocol import Runner, changed_rows, rule_inputs


class DeviceMasks:
    """The masks' copy on the device, brought up to date only when the caller hands other masks: a predictor
    hands the same read-only array batch after batch until its rules change, and then one that says which rows
    changed (``backend_protocol.changed_rows``), which alone are copied."""

    def __init__(self, device: torch.device):
        self.device = device
        self.source: np.ndarray | None = None
        self.copy: torch.Tensor | None = None

    def __call__(self, masks: np.ndarray) -> torch.Tensor:
        if masks is not self.source or self.copy is None:
            self.copy = copy_masks(masks, self.source, self.copy, self.device)
            self.source = masks
        return self.copy


def copy_masks(masks: np.ndarray, source: np.ndarray | None, copy: torch.Tensor | None, device) -> torch.Tensor:
    """``copy`` (of ``source``, on ``device``) brought to ``masks``: in place, the changed rows alone, where the
    masks say which rows changed since ``source``; else a whole new copy."""
    rows = changed_rows(masks, source) if copy is not None else None
    plain = np.asarray(masks)  # the book's array, as a plain one
    if rows is None or copy is None or tuple(copy.shape) != plain.shape:
        return torch.tensor(plain, device=device)  # read-only: copied
    if len(rows):
        copy[torch.from_numpy(rows).to(device)] = torch.from_numpy(plain[rows]).to(device)
    return copy


def torch_runner(fn, device: str | torch.device, num_items: int, optimized: bool = True) -> Runner:
    """A runner that moves inputs to ``device`` once, runs ``fn`` without autograd and returns numpy;
    ``optimized`` False runs a TorchScript ``fn`` without its optimizing executor, as Triton's backends run it
    (its GPU fuser compiles casts to float8, an 8-bit output layer's, into code that does not build)."""
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
        with torch.inference_mode(), torch.jit.optimized_execution(optimized):
            top_ids, scores = fn(move(ids), move(lengths), move(exclude), on_device(masks), *map(move, rows))
            top_ids, scores = top_ids[:, :k], scores[:, :k]  # the graph selected max_k; copy back only k
        return top_ids.cpu().numpy(), scores.float().cpu().numpy()

    return run
