"""Clients for a running recserve Triton server (HTTP and gRPC, sync and asyncio)."""

from recserve.client.triton import (
    AsyncRecommenderClient,
    RecommenderClient,
    RecommendError,
    Rules,
    ServerBusyError,
    ServerUnreachableError,
)

__all__ = [
    "AsyncRecommenderClient",
    "RecommendError",
    "RecommenderClient",
    "Rules",
    "ServerBusyError",
    "ServerUnreachableError",
]
