"""Where a BERT4Rec training step spends its time: recserve's batches, model and loss in a plain loop (no
Lightning), timed with CUDA events, and the top kernels from torch.profiler.

    python benchmarks/profile_step.py --items 100000 --loss sampled-uniform --batch-size 1024

With ``--devices 2`` each GPU runs one process (NCCL) and the model is wrapped in PyTorch's DDP the way
`recserve train --devices 2` wraps it: ``--batch-size`` is the step's whole batch, every rank builds it and
keeps its rows. Each ``--variants`` entry is timed in turn on the same process group (comma-separated;
``+``-joined options): ``bf16`` (gradients all-reduced as bf16, the trainer's default), ``view`` (DDP's
``gradient_as_bucket_view``), ``static`` (``static_graph``), ``fused`` (AdamW's fused kernel), ``local``
(no all-reduce at all: each GPU's compute alone, the floor), ``compile`` (torch.compile the objective, as
`recserve train --compile`), ``plain`` (none of these). Besides the step,
rank 0 prints the host's time to enqueue a step and the GPU's kernel time a step (from the profiler): a
step whose wall time exceeds its kernel time waits for the host or for the other GPU.

    python benchmarks/profile_step.py --items 1000000 --users 200000 --batch-size 2048 --devices 2 \\
        --variants bf16,bf16+view+static,bf16+view+static+fused,local --json runs/ddp-step.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from recserve.bench.synthetic import zipf_sequences
from recserve.data.sequences import Sequences
from recserve.models.bert4rec import Bert4Rec
from recserve.models.model_configs import Bert4RecConfig
from recserve.train.batches import ClozeSettings, WindowEpochs
from recserve.train.losses import CatalogueLoss
from recserve.train.objectives import cloze_loss
from recserve.train.train_config import LossSettings

OPTIONS = ("plain", "bf16", "view", "static", "fused", "local", "compile")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def wrap(model: torch.nn.Module, options: set[str], rank: int, world: int) -> torch.nn.Module:
    """The model as the variant trains it: itself on one GPU, or in DDP with the variant's options."""
    if world == 1:
        return model
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(
        model, device_ids=[rank], gradient_as_bucket_view="view" in options, static_graph="static" in options
    )
    if "bf16" in options:
        ddp.register_comm_hook(None, bf16_compress_hook)
    return ddp


class _Objective(torch.nn.Module):
    """The loss as a module's forward, so that DDP sees one call a step (as Lightning's wrapper does)."""

    def __init__(self, model, loss_fn, generator, compiled: bool):
        super().__init__()
        self.model, self.loss_fn, self.generator = model, loss_fn, generator
        self.objective = torch.compile(cloze_loss) if compiled else cloze_loss

    def forward(self, batch):
        return self.objective(self.model, batch, self.loss_fn, self.loss_fn.draw(self.generator))


def measure(args, variant: str, seq: Sequences, rank: int, world: int) -> dict:
    options = set(variant.split("+"))
    device = torch.device("cuda", rank)
    torch.manual_seed(0)
    cfg = Bert4RecConfig(num_items=args.items)
    model = Bert4Rec(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused="fused" in options)
    settings = ClozeSettings(cfg.window, cfg.mask_index, cfg.mask_prob, 0.15)
    batches = WindowEpochs(seq, settings, args.batch_size, 1, 0, device, rank, world)
    counts = np.bincount(seq.items, minlength=cfg.vocab_size)
    loss_fn = CatalogueLoss(LossSettings(args.loss, args.negatives), counts, cfg.mask_index, device)
    generator = torch.Generator(device).manual_seed(rank)
    iterator = _forever(batches)
    alone = "local" in options and world > 1
    stepper = wrap(_Objective(model, loss_fn, generator, "compile" in options), options, rank, world)

    def step():
        local = stepper.no_sync() if alone else contextlib.nullcontext()
        with torch.autocast("cuda", dtype=torch.bfloat16), local:
            loss = stepper(next(iterator))
            opt.zero_grad(set_to_none=True)
            loss.backward()
        opt.step()

    for _ in range(10):
        step()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    host = time.perf_counter()
    for _ in range(args.steps):
        step()
    host_ms = (time.perf_counter() - host) * 1e3 / args.steps
    end.record()
    torch.cuda.synchronize(device)
    ms = start.elapsed_time(end) / args.steps
    building = _batch_ms(iterator, device, args.steps)
    kernels = _kernels(step, device, 5, args.profile and rank == 0)  # every rank steps: DDP waits
    return {
        "variant": variant,
        "devices": world,
        "batch_size": args.batch_size,
        "rows_a_gpu": -(-args.batch_size // world),
        "ms_a_step": round(ms, 2),
        "host_ms_a_step": round(host_ms, 2),
        "kernel_ms_a_step": kernels["kernel_ms"],
        "launches_a_step": kernels["launches"],
        "host_syncs_a_step": kernels["syncs"],
        "batch_build_ms": building,
        "windows_per_s": round(args.batch_size / ms * 1000),
        "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2),
        "table": kernels["table"],
    }


def _forever(batches: WindowEpochs):
    """Batches epoch after epoch, as long as the steps ask."""
    epoch = 0
    while True:
        batches.set_epoch(epoch)
        yield from batches
        epoch += 1


def _batch_ms(iterator, device, steps: int) -> float:
    """GPU time to build one batch alone (a rank builds the whole batch and keeps its rows)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        next(iterator)
    end.record()
    torch.cuda.synchronize(device)
    return round(start.elapsed_time(end) / steps, 2)


def _kernels(step, device, steps: int, table: bool) -> dict:
    """A step's GPU kernel time, kernel launches and host waits on the GPU (from torch.profiler over
    ``steps`` steps); with ``table``, the top operators by GPU time and by the host's own time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize(device)
    averages = prof.key_averages()
    kernel_us = sum(e.self_device_time_total for e in averages if e.device_type == torch.autograd.DeviceType.CUDA)
    count = lambda names: round(sum(e.count for e in averages if e.key in names) / steps, 1)  # noqa: E731
    text = ""
    if table:
        text = "\n".join(
            averages.table(sort_by=key, row_limit=30, max_name_column_width=60)
            for key in ("cuda_time_total", "self_cpu_time_total")
        )
    return {
        "kernel_ms": round(kernel_us / 1e3 / steps, 2),
        "launches": count(LAUNCHES),
        "syncs": count(SYNCS),
        "table": text,
    }


def worker(rank: int, world: int, args) -> None:
    if world > 1:
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29534")
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world)
    seq = zipf_sequences(args.users, args.items, args.per_user)
    results = []
    for variant in args.variants.split(","):
        result = measure(args, variant, seq, rank, world)
        if rank == 0:
            table = result.pop("table")
            print(
                f"items {args.items} batch {args.batch_size} on {world} GPU(s), {variant}: "
                f"{result['ms_a_step']} ms a step (host {result['host_ms_a_step']} ms, kernels "
                f"{result['kernel_ms_a_step']} ms, {result['launches_a_step']} launches, "
                f"{result['host_syncs_a_step']} host waits, batch alone {result['batch_build_ms']} ms), "
                f"{result['windows_per_s']:,} windows/s, peak {result['peak_gib']} GiB",
                flush=True,
            )
            if table:
                print(table, flush=True)
            results.append(result | {"items": args.items, "loss": args.loss, "negatives": args.negatives})
        torch.cuda.empty_cache()
    if rank == 0 and args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        old = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps(old + results, indent=2) + "\n")
    if world > 1:
        torch.distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--per-user", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=1024, help="the step's whole batch, over all GPUs")
    parser.add_argument("--loss", default="sampled-uniform")
    parser.add_argument("--negatives", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--devices", type=int, default=1, help="GPUs (DDP, one process each, when more than one)")
    parser.add_argument("--variants", default="plain", help=f"comma-separated; each a +-joined set of {OPTIONS}")
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="no kernel table")
    parser.add_argument("--json", help="append the results to this JSON list")
    args = parser.parse_args()
    unknown = {o for v in args.variants.split(",") for o in v.split("+")} - set(OPTIONS)
    if unknown:
        parser.error(f"--variants: unknown {sorted(unknown)}; expected +-joined options from {OPTIONS}")
    if args.devices > torch.cuda.device_count():
        parser.error(f"--devices {args.devices}: {torch.cuda.device_count()} GPUs visible")
    if args.devices == 1:
        worker(0, 1, args)
    else:
        import torch.multiprocessing as mp

        mp.spawn(worker, args=(args.devices, args), nprocs=args.devices)


if __name__ == "__main__":
    main()
