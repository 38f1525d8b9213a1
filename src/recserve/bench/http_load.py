"""A closed-loop HTTP/1.1 load generator for endpoints perf_analyzer cannot drive (SageMaker's
``/invocations``): ``connections`` keep-alive connections, each sending its next request as soon as the
last answer is in, for a bounded time; latencies per request, statuses counted.

One asyncio loop on one thread, so its own cost (tens of microseconds a request) is shared by every endpoint
measured with it; compare endpoints measured by it in one run, not against perf_analyzer's figures.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class LoadResult:
    connections: int
    seconds: float
    requests: int  # answered within the measurement window
    throughput_rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    statuses: dict[str, int]  # status code (as text) -> count; "error" for a broken connection

    def to_dict(self) -> dict:
        return asdict(self)


def measure(
    host: str,
    port: int,
    path: str,
    bodies: Sequence[tuple[bytes, str]],
    connections: int,
    seconds: float,
    warmup_s: float = 1.0,
    timeout_s: float = 30.0,
) -> LoadResult:
    """``connections`` clients POSTing ``bodies`` (body, content type; each client cycles through them from its
    own offset) to ``http://host:port/path`` for ``warmup_s`` unmeasured, then ``seconds`` measured."""
    if connections < 1 or seconds <= 0 or not bodies:
        raise ValueError("measure: needs at least one connection, a positive duration and one body")
    requests = [_request(host, path, body, content_type) for body, content_type in bodies]
    return asyncio.run(_run(host, port, requests, connections, seconds, warmup_s, timeout_s))


def _request(host: str, path: str, body: bytes, content_type: str) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\nAccept: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _run(host, port, requests, connections, seconds, warmup_s, timeout_s) -> LoadResult:
    start = time.perf_counter()
    begin, end = start + warmup_s, start + warmup_s + seconds
    latencies: list[float] = []
    statuses: Counter[str] = Counter()

    async def client(offset: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            i = offset
            while (sent := time.perf_counter()) < end:
                writer.write(requests[i % len(requests)])
                i += 1
                try:
                    status, close = await asyncio.wait_for(_answer(reader), timeout_s)
                except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError):
                    statuses["error"] += 1
                    return
                done = time.perf_counter()
                if begin <= sent and done <= end:
                    latencies.append(done - sent)
                    statuses[str(status)] += 1
                if close:  # the server ends the connection after this answer (TorchServe does after an error)
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port)
        finally:
            writer.close()

    await asyncio.gather(*(client(n * 7) for n in range(connections)))
    ms = np.asarray(latencies) * 1e3
    p50, p90, p99 = np.percentile(ms, [50, 90, 99]) if ms.size else (np.nan,) * 3
    rate = len(ms) / seconds
    return LoadResult(connections, seconds, len(ms), rate, float(p50), float(p90), float(p99), dict(statuses))


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Reads one response (status line, headers, a Content-Length body); returns its status and whether the
    server closes the connection after it."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    fields = {key.strip().lower(): value.strip() for key, _, value in (line.partition(":") for line in lines[1:])}
    if "content-length" not in fields:
        raise ValueError("an answer without Content-Length")
    await reader.readexactly(int(fields["content-length"]))
    return status, fields.get("connection", "").lower() == "close"
