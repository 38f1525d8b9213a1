"""A call timed as recserve's backend runs its steps on a GPU: captured once as a CUDA graph, then replayed."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def replay_ms(fn: Callable[[], object], repeats: int = 50) -> float:
    """Median milliseconds of one replay of ``fn`` captured as a CUDA graph (warmed up first, on a side stream
    as capturing asks), timed by CUDA events."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
