"""Training and evaluation speed at catalogue scale, through `recserve train` itself.

For each setting a log is generated, prepared with `recserve data`, and trained for ``--epochs`` epochs (early
stopping off). The last epoch is measured: training windows/s and seconds (validation excluded), the GPU's
busy share sampled through NVML (or nvidia-smi) every 100 ms while it trains, and peak GPU memory. Then the
test split is ranked under every protocol (`recserve evaluate`'s code) and timed. One JSON file: {"device":
..., "results": [one object per setting]}.

The default log (``--generator markov``) has sequence in it: items in clusters of about 100, shoppers
walking between clusters by a fixed Markov chain (half the steps stay, the rest go to one of three
successors), each step's item drawn within its cluster by popularity (rank^-1; `recserve.bench.synthetic`).
The best possible predictor knows the chain, and its expected test NDCG@10 (the full protocol: history
excluded) is reported as ``ceiling_full_ndcg@10`` beside the model's and popularity's. ``--generator zipf``
is the log before: popularity ~ rank^-0.8 and no sequence, where a model can only learn popularity.

    python benchmarks/train_scale.py --out benchmarks/results/train-scale/h200.json --device cuda
    python benchmarks/train_scale.py --out benchmarks/results/train-scale/cpu-2core.json --device cpu \\
        --sizes 10000:10000,100000:10000,1000000:10000 --batch-size 128
    recserve data ../shared/data/video.txt --out runs/video --min-user-interactions 3
    python benchmarks/train_scale.py --out benchmarks/results/train-scale/h200-video.json --device cuda \
        --data runs/video --batch-size 128

A setting is ITEMS:USERS (ITEMS:USERS:LOSS to name a loss; else --loss). With ``--devices 2`` the run is
Lightning's DDP (one process a GPU, the batch split between them); only rank 0 evaluates and writes, and
``--data`` should name a prepared folder (each process runs this script, so a generated log would be
written twice). Windows per epoch are the model's default ``samples_per_user`` per training user.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from recserve.bench.synthetic import (
    ZIPF_EXPONENT,
    MarkovWorld,
    prepared_ceiling,
    write_markov_log,
    write_zipf_log,
)
from recserve.data.datasets import load_prepared, prepare
from recserve.train.epoch_meter import EpochMeter, host
from recserve.train.heldout import evaluate_heldout_run
from recserve.train.leave_one_out import evaluate_run
from recserve.train.train_config import MODEL_DEFAULTS, TrainConfig
from recserve.train.trainer import train


def run_setting(
    data_dir: Path,
    run_dir: Path,
    cfg: TrainConfig,
    model_overrides: dict,
    model: str,
    test: bool = True,
    world: MarkovWorld | None = None,
) -> dict | None:
    meter = EpochMeter()
    summary = train(data_dir, run_dir, model_overrides, cfg, model=model, callbacks=[meter], overwrite=True)
    if not summary:
        return None  # a DDP process other than rank 0
    data = load_prepared(data_dir)
    device = "cuda" if cfg.accelerator == "gpu" else "cpu"
    last = meter.epochs[-1]
    if model == "multvae":  # a window is a training user's bag of items
        evaluated = evaluate_heldout_run(run_dir, data_dir, device=device)
        windows, quality = (
            evaluated["split"]["train_users"],
            {
                "test_ndcg@100": evaluated["test"]["heldout"]["ndcg@100"],
                "popularity_ndcg@100": evaluated["popularity"]["heldout"]["ndcg@100"],
            },
        )
    else:
        windows = int((data.train.lengths > 0).sum()) * cfg.samples_per_user
        evaluated = evaluate_run(run_dir, data_dir, device=device) if test else {"eval": {}}
        quality = (
            {
                "test_full_ndcg@10": evaluated["test"]["full"]["ndcg@10"],
                "popularity_full_ndcg@10": evaluated["popularity"]["full"]["ndcg@10"],
            }
            if test
            else {}
        )
        if test and world is not None:
            quality["ceiling_full_ndcg@10"] = prepared_ceiling(world, data)
    return {
        "model": model,
        "items": int(data.vocab.num_items),
        "users": int(data.sequences.num_users),
        "interactions": int(len(data.sequences.items)),
        "loss": summary.get("loss", {}).get("name", "multinomial (full softmax)"),
        "loss_settings": summary.get("loss"),
        "batch_size": cfg.batch_size,
        "devices": cfg.devices,
        "ddp_compress": cfg.ddp_compress if cfg.devices > 1 else None,
        "samples_per_user": cfg.samples_per_user,
        "precision": cfg.lightning_precision,
        "compile": cfg.compile,
        "cuda_graph": summary["steps"].get("cuda_graph"),  # the steps replayed as a CUDA graph, and the eager ones
        "windows": windows,
        "windows_per_s": round(windows / last["train_s"]),
        "epoch_s": round(last["train_s"], 2),
        "val_s": round(last.get("val_s", float("nan")), 3),
        "eval_s": evaluated["eval"].get("seconds"),
        "eval_protocols": evaluated["eval"].get("protocols"),
        "generator": (
            f"popularity ~ rank^-{ZIPF_EXPONENT}, Poisson lengths"
            if world is None
            else f"Markov walks between {len(world.start)} clusters (stay {world.stay}), popularity within"
        ),
        "peak_gpu_mem_gb": None if last["peak_gpu_mem_gb"] is None else round(last["peak_gpu_mem_gb"], 2),
        "gpu_busy_pct": None if last["gpu_busy_pct"] is None else round(last["gpu_busy_pct"], 1),
        "epochs_measured": f"the last of {len(meter.epochs)}",
        "every_epoch": meter.epochs,
        **quality,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument(
        "--sizes",
        default="10000:100000,100000:200000,1000000:200000",
        help="ITEMS:USERS[:LOSS] settings, comma-separated",
    )
    parser.add_argument("--interactions-per-user", type=int, default=50)
    parser.add_argument(
        "--generator", default="markov", choices=["markov", "zipf"], help="logs with sequence in them, or without"
    )
    parser.add_argument("--data", help="a prepared folder (`recserve data`) to time instead of generated logs")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="bert4rec", choices=["bert4rec", "sasrec", "multvae"])
    parser.add_argument("--devices", type=int, default=1, help="GPUs; DDP when more than one (give --data)")
    parser.add_argument("--no-test", action="store_true", help="skip the test split's evaluation")
    parser.add_argument("--no-ddp-compress", action="store_true", help="all-reduce float32 gradients, not bf16")
    parser.add_argument("--epochs", type=int, default=2, help="the last one is measured")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--loss", default="auto")
    parser.add_argument("--negatives", type=int, default=TrainConfig.negatives, help="sampled: items drawn a batch")
    parser.add_argument("--patience", type=int, help="early stopping (default: none, every epoch runs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--memory-gb", type=float, help="cap this process's GPU memory (set_per_process_memory_fraction), e.g. 24"
    )
    parser.add_argument(
        "--plain-kernels",
        action="store_true",
        help="the sampled loss's blocks and the test ranking's count uncompiled, no Triton kernels (for comparison)",
    )
    parser.add_argument(
        "--no-pool-kernels",
        action="store_true",
        help="the sampled loss's log-sum-exp in compiled blocks that write the logits, not Triton kernels",
    )
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--no-cuda-graphs", action="store_true", help="eager steps, not a captured step's replays")
    parser.add_argument("--ema-epochs", type=float, help="the weights' moving average (default: the model's own)")
    parser.add_argument(
        "--no-relative-positions", action="store_true", help="SASRec without its learned attention bias per distance"
    )
    parser.add_argument(
        "--prepare-only", action="store_true", help="generate and prepare each --sizes log in --work, train nothing"
    )
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--work", help="folder for data and runs (a temporary one by default)")
    args = parser.parse_args()
    if args.prepare_only and (args.data or not args.work):
        parser.error("--prepare-only generates --sizes logs into --work (and takes no --data)")
    if args.devices > 1 and not (args.data and args.work):
        parser.error("--devices above 1 needs --data and --work: every DDP process runs this script")
    cpu_name = f"CPU ({platform.processor() or 'x86_64'}, {torch.get_num_threads()} threads)"
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" and not args.prepare_only else cpu_name
    if args.memory_gb:
        total_gb = torch.cuda.get_device_properties(0).total_memory / 2**30
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_gb / total_gb))
    if args.plain_kernels:
        from recserve.train.fused import GpuFused

        GpuFused.enabled = False
    pool_kernels = not (args.plain_kernels or args.no_pool_kernels)
    if not pool_kernels:
        from recserve.train.pool_kernels import PoolKernels

        PoolKernels.enabled = False
    work = Path(args.work or tempfile.mkdtemp(prefix="train-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    settings = (
        [(Path(args.data).name, args.data, args.loss)]
        if args.data
        else [
            (f"{s.split(':')[0]}:{s.split(':')[1]}", s, s.split(":")[2] if s.count(":") == 2 else args.loss)
            for s in args.sizes.split(",")
        ]
    )
    for name, spec, loss in settings:
        data_dir = Path(spec) if args.data else work / f"data-{name.replace(':', '-')}"
        world = None
        if not args.data:
            items, users = (int(x) for x in spec.split(":")[:2])
            log = work / "log.parquet"
            if args.generator == "markov":
                world = write_markov_log(log, users, items, args.interactions_per_user, args.seed)
            else:
                write_zipf_log(log, users, items, args.interactions_per_user)
            prepared = prepare(str(log), data_dir)
            if args.prepare_only:
                results.append({"setting": name, "data": str(data_dir), "prepared": prepared})
                Path(args.out).write_text(json.dumps({"results": results}, indent=2) + "\n")
                print(f"{name}: prepared in {data_dir}", flush=True)
                continue
        # the model's own defaults (`recserve train`'s), but for what this benchmark sets: training's speed, so no
        # refit (the sequence models' default: the chosen epochs again after validation, timed by `recserve train`)
        cfg = TrainConfig(
            **MODEL_DEFAULTS[args.model]
            | dict(
                epochs=args.epochs,
                batch_size=args.batch_size,
                patience=args.patience or args.epochs + 1,
                negatives=args.negatives,
                seed=args.seed,
                device=args.device,
                devices=args.devices,
                ddp_compress=not args.no_ddp_compress,
                loss=loss,
                compile=args.compile,
                cuda_graphs=not args.no_cuda_graphs,
                resume=False,
                refit=False,
            )
            | ({} if args.ema_epochs is None else {"ema_epochs": args.ema_epochs})
        )
        overrides = {"window": args.window, "hidden": args.hidden} if args.model != "multvae" else {}
        if args.no_relative_positions:
            overrides["relative_positions"] = False
        started = time.perf_counter()
        run_name = f"run-{name.replace(':', '-')}-{args.model}-{args.devices}-{args.batch_size}"
        result = run_setting(data_dir, work / run_name, cfg, overrides, args.model, not args.no_test, world)
        if result is None:
            continue
        result["setting"], result["wall_s"] = name, round(time.perf_counter() - started, 1)
        result["memory_cap_gb"], result["plain_kernels"], result["seed"] = args.memory_gb, args.plain_kernels, args.seed
        result["pool_kernels"] = pool_kernels
        result["ema_epochs"], result["model_overrides"] = cfg.ema_epochs, overrides
        results.append(result)
        print(
            f"{name} {args.model} x{args.devices}: {result['items']:,} items, {result['users']:,} users, "
            f"loss {result['loss']}: "
            f"{result['windows_per_s']:,} windows/s, epoch {result['epoch_s']} s, eval {result['eval_s']} s, "
            f"peak {result['peak_gpu_mem_gb']} GB, GPU busy {result['gpu_busy_pct']}%"
            + (f", test NDCG@10 {result['test_full_ndcg@10']:.4f}" if "test_full_ndcg@10" in result else "")
            + (f" (popularity {result['popularity_full_ndcg@10']:.4f})" if "test_full_ndcg@10" in result else "")
            + (f", ceiling {result['ceiling_full_ndcg@10']:.4f}" if "ceiling_full_ndcg@10" in result else ""),
            flush=True,
        )
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps(
                {
                    "device": device_name,
                    "host": host(),
                    "command": " ".join(sys.argv),
                    "torch": torch.__version__,
                    "results": results,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
