"""A call timed as recserve's backend runs its steps on a GPU: captured once as a CUDA graph, then replayed."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from recserve.export.native_export import captured


def replay_ms(fn: Callable[[], object], repeats: int = 50) -> float:
    """Median milliseconds of one replay of ``fn`` captured as a CUDA graph (warmed up first, on a side stream
    as capturing asks), timed by CUDA events."""
    graph, _ = captured(fn)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
