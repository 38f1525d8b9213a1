"""How a repository's models batch, queue and place their instances (``RepositorySettings``). Nothing of the
export stage, no protobuf and no torch: the Kubernetes manifests and the benchmarks read these without the
repository writer. The repository's record is ``recserve.artifacts.repository_record``'s."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from recserve.devices import serving_device
from recserve.option_fields import option

GPU_QUEUE_DELAY_US = 300
NATIVE_CPU_INSTANCES_MAX = 8  # the default's cap: each instance is a copy of the model in memory


def gpu_ids(text: str) -> tuple[int, ...]:
    """GPU ids from their comma-separated list ("0,1"); a ``ValueError`` names the text."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as err:
        raise ValueError(f"{text!r}: expected GPU ids such as 0,1") from err


@dataclass(frozen=True)
class RepositorySettings:
    """How a repository's models batch, queue and where their instances run (Triton's own field names, units
    in names); the server's own settings are `launcher.ServerSettings`. A field with a help is an option of
    `recserve repo`."""

    max_batch_size: int = option(256, "Largest dynamic batch.")
    preferred_batch_sizes: tuple[int, ...] = ()
    # None: 0 on CPU, where an idle instance should take what is queued at once (+8% at concurrency 16 on 2
    # cores against 200 us), 300 on a GPU, where bigger batches amortise each launch (+17% at concurrency 256
    # on an H200 against 100 us). See docs/benchmarks.md.
    max_queue_delay_microseconds: int | None = option(
        None, "Batcher wait to fill a batch; default: 0 on cpu, 300 on gpu (measured best on each)."
    )
    # A queue policy bounds the queue (beyond max_queue_size: rejected at once, UNAVAILABLE / 503) and
    # rejects requests queued longer than the timeout. Off by default: with any default_queue_policy,
    # Triton 2.51's dynamic batcher stalls some requests for about 500 ms (measured: echo at concurrency 16
    # drops from ~6,900 to ~1,000 requests/s, p99 from 4 ms to 503 ms). Turn it on for overload protection.
    max_queue_size: int = option(
        0,
        "Queued requests beyond this are rejected (503); 0: unbounded. Any queue policy costs ~500 ms stalls on "
        "Triton 2.51 (see docs/benchmarks.md).",
    )
    queue_timeout_microseconds: int = option(
        0,
        "Queued longer than this: rejected; 0: no timeout.",
        flags=("--queue-timeout-ms",),
        parse=lambda ms: ms * 1000,
    )
    instance_count: int = option(1, "Model instances (on each GPU that --gpus names).", flags=("--instances",))
    # Each instance holds its own copy of the model; on CPUs they are threads inside the server, and more of
    # them cut the tail (docs/benchmarks.md).
    native_instance_count: int | None = option(
        None,
        "The native layout's instances [on cpu: at least --instances and 4 a core, at most 8 (threads in the "
        "server: more cut the tail); on gpu: --instances].",
        flags=("--native-instances",),
        min=1,
    )
    device: str = option("cpu", "cpu or gpu (cuda is taken for gpu): where model instances run.", parse=serving_device)
    # native_models.NATIVE_RUNTIMES
    native_runtime: str | None = option(
        None,
        "What runs the native layout's TorchScript graph: recserve (recserve's own Triton backend: one CUDA graph "
        "per batch size on GPUs) or pytorch (Triton's PyTorch backend, operator by operator) [recserve on gpu, "
        "pytorch on cpu]. An onnx export runs on the onnxruntime backend.",
    )
    gpus: tuple[int, ...] = option(
        (),
        "With --device gpu: comma-separated GPU ids, e.g. 0,1, each given --instances instances; empty: Triton "
        "places them.",
        cli_type=str,
        cli_default="",
        parse=gpu_ids,
    )
    response_cache: bool = option(False, "Enable Triton's response cache for the model.")
    versions_served: int = option(1, "Serve the newest N versions.")
    session_store: str | None = option(
        None,
        "The session store: a folder of `recserve store start`, or a JSON file of its settings (url, username, "
        "password_file, prefix, window, ttl_s, timeout_s; never the password itself). The session layouts read "
        "sessions from it; with it, the fused layout too keeps out the items `recserve items hide` hides. "
        "[default: a layout by session gets recserve's embedded store (store/ in recserve's cache folder), "
        "started if need be]",
        cli_type=Path,
        parse=str,
    )
    step_summary_s: int = option(
        0,
        "recserve's backend: every N seconds (and after the first batch), each instance logs its batches' steps: "
        "the median, 99th percentile and largest time of reading requests, the store, the inputs' copies, the "
        "graph and the answers. 0: never.",
        min=0,
    )
    rules: str | None = option(
        None,
        "Business rules to store by name, which requests then name in their `rule` input: a TOML or JSON file "
        "of name = rule (docs/rules.md), each checked against the export's item attributes.",
        cli_type=Path,
        parse=str,
    )

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
