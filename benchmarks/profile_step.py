"""Where a BERT4Rec training step spends its time: recserve's batches, model and loss in a plain loop (no
Lightning), timed with CUDA events, and the top kernels from torch.profiler.

    python benchmarks/profile_step.py --items 100000 --loss sampled-uniform --batch-size 1024
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from recserve.data.sequences import Sequences
from recserve.models.bert4rec import Bert4Rec, Bert4RecConfig
from recserve.train.batches import ClozeSettings, WindowEpochs
from recserve.train.losses import CatalogueLoss, LossSettings
from recserve.train.objectives import cloze_loss


def synthetic(users: int, items: int, per_user: int, seed: int = 0) -> Sequences:
    rng = np.random.default_rng(seed)
    lengths = rng.poisson(per_user, users).clip(3)
    ranks = np.minimum(rng.zipf(1.2, lengths.sum()), items) - 1
    return Sequences(
        items=(rng.permutation(items)[ranks] + 1).astype(np.int64),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--per-user", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--loss", default="sampled-uniform")
    parser.add_argument("--negatives", type=int, default=8192)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--no-profile", action="store_true")
    args = parser.parse_args()
    device = "cuda"
    seq = synthetic(args.users, args.items, args.per_user)
    cfg = Bert4RecConfig(num_items=args.items)
    model = Bert4Rec(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    batches = WindowEpochs(
        seq, ClozeSettings(cfg.window, cfg.mask_index, cfg.mask_prob, 0.15), args.batch_size, 1, 0, device
    )
    counts = np.bincount(seq.items, minlength=cfg.vocab_size)
    loss_fn = CatalogueLoss(LossSettings(args.loss, args.negatives), counts, cfg.mask_index, device)
    step_loss = torch.compile(cloze_loss) if args.compile else cloze_loss
    generator = torch.Generator(device).manual_seed(0)
    iterator = iter(batches)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_loss(model, next(iterator), loss_fn, generator)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.steps):
        step()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / args.steps
    print(
        f"items {args.items} loss {args.loss} batch {args.batch_size} compile {args.compile} capacity "
        f"{batches.capacity}: {ms:.2f} ms a step, {args.batch_size / ms * 1000:,.0f} windows/s, "
        f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB",
        flush=True,
    )
    if args.no_profile:
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
