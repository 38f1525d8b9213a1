"""The learning-rate schedule, in torch alone (the plain-PyTorch sweep in benchmarks/ uses it too)."""

from __future__ import annotations

import math

import torch


def cosine_with_warmup(opt: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step schedule: a linear warm-up over the first 5% of ``total_steps``, then a cosine down to 0."""
    total = max(int(total_steps), 1)
    warmup = max(1, total // 20)

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(step, total) / total))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)
