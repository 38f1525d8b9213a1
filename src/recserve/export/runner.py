"""Wraps a torch callable as the predictor's numpy runner."""

from __future__ import annotations

import numpy as np
import torch

from recserve.export.backend_protocol import Runner


def torch_runner(fn, device: str | torch.device) -> Runner:
    """A runner that moves inputs to ``device`` once, runs ``fn`` without autograd and returns numpy."""
    device = torch.device(device)

    def run(ids: np.ndarray, lengths: np.ndarray, exclude: np.ndarray, k: int | None = None):
        with torch.inference_mode():
            top_ids, scores = fn(
                torch.from_numpy(ids).to(device, non_blocking=True),
                torch.from_numpy(lengths).to(device, non_blocking=True),
                torch.from_numpy(np.ascontiguousarray(exclude)).to(device, non_blocking=True),
            )
            top_ids, scores = top_ids[:, :k], scores[:, :k]  # the graph selected max_k; copy back only k
        return top_ids.cpu().numpy(), scores.float().cpu().numpy()

    return run
