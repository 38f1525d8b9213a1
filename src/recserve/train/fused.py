"""Functions that torch.compile fuses on GPUs, where eager PyTorch makes one pass over memory per operation;
on CPUs they run as written."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)


def fall_back_to(plain: Callable, compiled: Callable, what: str) -> Callable:
    """``compiled``, or ``plain`` from the first call on if compiling it fails (no GPU compiler, say), said
    once in the log as "``what`` runs uncompiled"."""
    state = {"fn": compiled}

    def call(*args: Any) -> Any:
        try:
            return state["fn"](*args)
        except Exception as err:  # torch.compile's errors have no common base class
            if state["fn"] is plain:
                raise
            log.warning("%s runs uncompiled: torch.compile failed (%s)", what, err)
            state["fn"] = plain
            return plain(*args)

    return call


class GpuFused:
    """``plain`` compiled (once, on first use) where its first tensor argument is on a CUDA device; as
    written elsewhere, or everywhere while ``enabled`` is False (for comparison)."""

    enabled = True

    def __init__(self, plain: Callable, what: str, dynamic: bool | None = None):
        self.plain, self.what, self.dynamic = plain, what, dynamic
        self.compiled: Callable | None = None

    def __call__(self, *args: Any) -> Any:
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        if device.type != "cuda" or not GpuFused.enabled:
            return self.plain(*args)
        if self.compiled is None:
            self.compiled = fall_back_to(self.plain, torch.compile(self.plain, dynamic=self.dynamic), self.what)
        return self.compiled(*args)
