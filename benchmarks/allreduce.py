"""All-reduce bandwidth between the GPUs (NCCL, one process a GPU): the bound on DDP's gradient exchange.

Times an all-reduce of a catalogue-sized embedding gradient (ITEMS x 64) in float32 and in bf16 and prints
one JSON line per size. Usage: python benchmarks/allreduce.py [--items 1000000] [--gpus 2]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, world: int, items: int, repeats: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    for dtype in (torch.float32, torch.bfloat16):
        grad = torch.ones(items, 64, device="cuda", dtype=dtype)
        for _ in range(3):
            dist.all_reduce(grad)
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(repeats):
            dist.all_reduce(grad)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / repeats
        size = grad.numel() * grad.element_size()
        if rank == 0:  # ring all-reduce: each GPU sends and receives 2 (n - 1) / n of the buffer
            print(
                json.dumps(
                    {
                        "items": items,
                        "dtype": str(dtype).removeprefix("torch."),
                        "mb": round(size / 2**20),
                        "ms": round(seconds * 1e3, 2),
                        "bus_gb_s": round(size * 2 * (world - 1) / world / seconds / 1e9, 1),
                    }
                ),
                flush=True,
            )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    mp.spawn(_worker, args=(args.gpus, args.items, args.repeats), nprocs=args.gpus)


if __name__ == "__main__":
    main()
