"""How a repository's models batch, queue and place their instances (``RepositorySettings``), and the
repository's record (``recserve.json``: the run it serves, each layout's export). Nothing of the export
stage, no protobuf and no torch: the Kubernetes manifests and the benchmarks read these without the
repository writer."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from recserve.constants import REPOSITORY_FILE

GPU_QUEUE_DELAY_US = 300
NATIVE_CPU_INSTANCES_MAX = 8  # the default's cap: each instance is a copy of the model in memory


@dataclass(frozen=True)
class RepositorySettings:
    """How a repository's models batch, queue and where their instances run (Triton's own field names, units
    in names); the server's own settings are `launcher.ServerSettings`."""

    max_batch_size: int = 256
    preferred_batch_sizes: tuple[int, ...] = ()
    # How long the batcher waits to fill a batch; None: 0 on CPU, where an idle instance should take what is
    # queued at once (+8% at concurrency 16 on 2 cores against 200 us), 300 on a GPU, where bigger batches
    # amortise each launch (+17% at concurrency 256 on an H200 against 100 us). See docs/benchmarks.md.
    max_queue_delay_microseconds: int | None = None
    # A queue policy bounds the queue (beyond max_queue_size: rejected at once, UNAVAILABLE / 503) and
    # rejects requests queued longer than the timeout. Off by default: with any default_queue_policy,
    # Triton 2.51's dynamic batcher stalls some requests for about 500 ms (measured: echo at concurrency 16
    # drops from ~6,900 to ~1,000 requests/s, p99 from 4 ms to 503 ms). Turn it on for overload protection.
    max_queue_size: int = 0  # 0: unbounded
    queue_timeout_microseconds: int = 0  # 0: no timeout
    instance_count: int = 1  # per GPU where ``gpus`` names them
    # The native layout's instances; None: on CPUs at least instance_count and 4 a core (at most 8), where
    # they are threads inside the server and more of them cut the tail (docs/benchmarks.md); on GPUs
    # instance_count. Each instance holds its own copy of the model.
    native_instance_count: int | None = None
    device: str = "cpu"  # cpu or gpu: where model instances run
    # What runs a TorchScript native model (native_models.NATIVE_RUNTIMES); None: recserve's own backend on
    # GPUs, Triton's PyTorch backend on CPUs
    native_runtime: str | None = None
    gpus: tuple[int, ...] = ()  # gpu: the devices that each get instance_count instances; () lets Triton place them
    response_cache: bool = False
    versions_served: int = 1  # the newest N versions are served
    # the session layout's store: a store folder (`recserve store start`) or a JSON file of StoreSettings
    session_store: str | None = None

    @property
    def native_instances(self) -> int:
        if self.native_instance_count is not None:
            return self.native_instance_count
        if self.device == "gpu":
            return self.instance_count
        return max(self.instance_count, min(NATIVE_CPU_INSTANCES_MAX, 4 * len(os.sched_getaffinity(0))))

    @property
    def queue_delay_microseconds(self) -> int:
        if self.max_queue_delay_microseconds is not None:
            return self.max_queue_delay_microseconds
        return GPU_QUEUE_DELAY_US if self.device == "gpu" else 0


def record_layouts(
    repo: Path, layouts: tuple[str, ...], export: dict[str, str], run: str, session_store: dict | None = None
) -> None:
    """Adds the layouts just written to the repository's record, with the export each was built from
    (``export``: its backend, precision and device) and the run it came from; the session layout's with
    its store's record (``session_store``: never a password)."""
    info = read_repository_info(repo)
    for layout in layouts:
        info["layouts"][layout] = dict(export) | ({"session_store": session_store} if layout == "session" else {})
    info["run"] = run
    (repo / REPOSITORY_FILE).write_text(json.dumps(info, indent=2) + "\n")


def read_repository_info(repo: Path) -> dict:
    """The repository's record (``recserve.json``): the run it serves and each layout's export (backend,
    precision, device); empty if none."""
    path = Path(repo) / REPOSITORY_FILE
    info = json.loads(path.read_text()) if path.is_file() else {}
    if not isinstance(info.get("layouts"), dict):  # written by an older recserve: a list of names
        info["layouts"] = {}
    return info
