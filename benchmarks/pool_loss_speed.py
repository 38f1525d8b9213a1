"""The sampled loss's pool log-sum-exp at a training step's shape, forward and backward under bf16 autocast:
Triton kernels (``train/pool_kernels.py``, each of --configs) against the compiled blocks that write the
logits (``--no-pool-kernels`` in train_scale.py), timed with CUDA events after a warm-up, each gradient's
distance from the float32 computation, whether the kernels' second run repeats the first bit for bit, and
the kernels' own device times (torch.profiler). One JSON file.

    python benchmarks/pool_loss_speed.py --positions 102400 --pool 16384 --hidden 64 --out runs/pool-loss.json

The default shape is SASRec's step at 1M items: 1,024 windows of 100 positions, 8,192 in-batch targets and
8,192 drawn negatives.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import recserve.train.losses as losses
import recserve.train.pool_kernels as pool_kernels
from recserve.train.epoch_meter import host
from recserve.train.pool_kernels import PoolKernels


def inputs(positions: int, pool_size: int, hidden: int, samples: int, window: int) -> dict:
    """A step's tensors: queries and pool vectors as a trained model's are scaled, seen items in each window."""
    gen = torch.Generator("cuda").manual_seed(0)
    items = 1_000_000
    pool = torch.randint(2, items, (pool_size,), device="cuda", generator=gen)
    history = torch.randint(2, items, (samples, window), device="cuda", generator=gen)
    history[:, :20] = pool[torch.randint(0, pool_size, (samples, 20), device="cuda", generator=gen)]
    return {
        "query": torch.randn(positions, hidden, device="cuda", generator=gen),
        "vectors": torch.randn(pool_size, hidden, device="cuda", generator=gen) * 0.2,
        "bias": torch.randn(pool_size, device="cuda", generator=gen),
        "pool": pool,
        "targets": torch.randint(2, items, (positions,), device="cuda", generator=gen),
        "seen": losses.first_columns(history, pool),
        "rows": torch.arange(positions, device="cuda") // window,
        "limit": (torch.arange(positions, device="cuda") % window).to(torch.int16),
    }


def step(tensors: dict, bf16: bool = True) -> list[torch.Tensor]:
    """One forward and backward; the gradients of the query, the vectors and the bias."""
    leaves = [tensors[name].clone().requires_grad_() for name in ("query", "vectors", "bias")]
    with torch.autocast("cuda", torch.bfloat16, enabled=bf16):
        lse = losses.pool_logsumexp(*leaves, *(tensors[n] for n in ("pool", "targets", "seen", "rows", "limit")))
    lse.where(lse.isfinite(), 0.0).sum().backward()
    return [leaf.grad for leaf in leaves]


def timed(tensors: dict, repeats: int) -> float:
    """Milliseconds a step, the median of ``repeats`` after three warm-up steps."""
    for _ in range(3):
        step(tensors)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(tensors)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def kernel_times(tensors: dict) -> dict[str, float]:
    """Milliseconds of device time a step, by kernel, of the kernels that take a millisecond's tenth or more."""
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(5):
            step(tensors)
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)
    times = {e.key[:80]: round(e.self_device_time_total / 5000, 3) for e in events}
    return {name: ms for name, ms in times.items() if ms >= 0.1}


def repeats_exactly(tensors: dict) -> bool:
    """Whether two steps give the same gradients, bit for bit."""
    return all(torch.equal(a, b) for a, b in zip(step(tensors), step(tensors)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--positions", type=int, default=102_400)
    parser.add_argument("--pool", type=int, default=16_384)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--configs",
        default="",
        help="kernel settings to time besides the default, comma-separated: positions x pool items x warps x stages "
        "(e.g. 128x64x4x3)",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    tensors = inputs(args.positions, args.pool, args.hidden, args.positions // args.window, args.window)
    PoolKernels.enabled = False
    exact = step(tensors, bf16=False)
    rows = []

    def record(way: str) -> None:
        ms = timed(tensors, args.repeats)
        grads = step(tensors)
        errors = [float((g.float() - e).norm() / e.norm()) for g, e in zip(grads, exact)]
        rows.append({"way": way, "step_ms": round(ms, 3), "relative_error_query_vectors_bias": errors})
        print(f"{way:28s} {ms:8.3f} ms  errors {', '.join(f'{e:.4f}' for e in errors)}", flush=True)

    record("compiled blocks")
    PoolKernels.enabled = True
    block_h = max(16, 1 << (args.hidden - 1).bit_length())
    default = pool_kernels.CONFIGS[block_h]
    record("kernels " + "x".join(map(str, default)))
    for text in filter(None, args.configs.split(",")):
        pool_kernels.CONFIGS[block_h] = tuple(int(part) for part in text.split("x"))
        record("kernels " + text)
    pool_kernels.CONFIGS[block_h] = default
    exact_repeat, profile = repeats_exactly(tensors), kernel_times(tensors)
    print(f"the kernels repeat bit for bit: {exact_repeat}; device ms a step by kernel: {profile}")
    result = {
        "settings": vars(args),
        "device": torch.cuda.get_device_name(0),
        "host": host(),
        "torch": torch.__version__,
        "when": time.strftime("%Y-%m-%d"),
        "results": rows,
        "kernels_repeat_bit_for_bit": exact_repeat,
        "kernel_device_ms": profile,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
