"""A hyperparameter sweep of recserve's BERT4Rec on a leave-one-out split, in plain PyTorch.

It uses recserve's own model, Cloze batches and ranking code, but not Lightning or polars, so that it runs
on a bare GPU machine (numpy and torch only). Each setting trains on items[:-2], validates NDCG@10 (full
ranking, seen items excluded) each epoch, and reports the test metrics of its best validation epoch.
Settings that win here are then confirmed with `recserve train` (see docs/quality.md).

    python benchmarks/bert4rec_sweep.py export --data runs/ml100k --out sequences.npz   # needs recserve's deps
    python benchmarks/bert4rec_sweep.py run --seqs sequences.npz --out sweep/ --device cuda --workers 8
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

BASE_MODEL = dict(window=100, hidden=64, layers=2, heads=2, dropout=0.2, mask_prob=0.2)
BASE_TRAIN = dict(
    lr=1e-3,
    weight_decay=0.01,
    batch_size=128,
    samples_per_user=4,
    last_item_rate=0.15,
    epochs=200,
    patience=20,
    lr_schedule="constant",
    loss_exclude_seen=False,
)

# one change at a time from the base, then a few combinations
GRID = [
    {},
    {"last_item_rate": 0.3},
    {"last_item_rate": 0.5},
    {"last_item_rate": 1.0},
    {"mask_prob": 0.1},
    {"mask_prob": 0.3},
    {"mask_prob": 0.4},
    {"dropout": 0.1},
    {"dropout": 0.3},
    {"dropout": 0.5},
    {"hidden": 128, "dropout": 0.3},
    {"hidden": 256, "heads": 4, "dropout": 0.5},
    {"layers": 1},
    {"layers": 4},
    {"lr": 3e-4},
    {"lr": 2e-3},
    {"weight_decay": 0.1},
    {"weight_decay": 0.0},
    {"samples_per_user": 16},
    {"batch_size": 256},
    {"window": 50},
    {"window": 200},
    {"last_item_rate": 0.3, "mask_prob": 0.3},
    {"last_item_rate": 0.5, "dropout": 0.3},
    {"hidden": 128, "dropout": 0.3, "last_item_rate": 0.3, "samples_per_user": 8},
]

# combinations of the best single changes of the first grid
COMBINED = [
    {},
    {"layers": 1},
    {"hidden": 256, "heads": 4, "dropout": 0.5},
    {"layers": 1, "hidden": 256, "heads": 4, "dropout": 0.5},
    {"layers": 1, "samples_per_user": 16},
    {"layers": 1, "mask_prob": 0.4},
    {"hidden": 256, "heads": 4, "dropout": 0.5, "mask_prob": 0.4},
    {"layers": 1, "hidden": 128, "dropout": 0.3, "mask_prob": 0.3},
]
_COSINE = {"lr_schedule": "cosine", "epochs": 100, "patience": 100}
SCHEDULE = [
    base | extra
    for base in ({}, {"layers": 1, "mask_prob": 0.4}, {"hidden": 256, "heads": 4, "dropout": 0.5, "mask_prob": 0.4})
    for extra in ({}, {"loss_exclude_seen": True}, _COSINE, _COSINE | {"loss_exclude_seen": True})
]
_BIG = {"hidden": 256, "heads": 4, "dropout": 0.5, "mask_prob": 0.4, "loss_exclude_seen": True}
FINAL = [
    {"layers": 1, "mask_prob": 0.4, "loss_exclude_seen": True},
    _BIG,
    _BIG | _COSINE,
    {"hidden": 128, "dropout": 0.4, "mask_prob": 0.4, "loss_exclude_seen": True},
    {
        "layers": 1,
        "hidden": 128,
        "dropout": 0.4,
        "mask_prob": 0.4,
        "loss_exclude_seen": True,
        "lr_schedule": "cosine",
        "epochs": 60,
        "patience": 60,
    },
]
GRIDS = {"one-at-a-time": GRID, "combined": COMBINED, "schedule": SCHEDULE, "final": FINAL}


def _optimizer(model, train_kw: dict, steps: int):
    """AdamW, with the LR constant or on recserve's cosine from a 5% warm-up down to 0 over ``steps``."""
    import torch

    from recserve.train.schedule import cosine_with_warmup

    opt = torch.optim.AdamW(model.parameters(), lr=train_kw["lr"], weight_decay=train_kw["weight_decay"])
    if train_kw["lr_schedule"] == "constant":
        return opt, None
    return opt, cosine_with_warmup(opt, steps)


def export_sequences(data_dir: str, out: str) -> None:
    from recserve.data.datasets import load_prepared

    data = load_prepared(data_dir)
    np.savez(out, items=data.sequences.items, offsets=data.sequences.offsets, num_items=data.vocab.num_items)


def train_one(job: dict) -> dict:
    import torch

    from recserve.data.sequences import Sequences
    from recserve.models.bert4rec import Bert4Rec
    from recserve.models.model_configs import Bert4RecConfig
    from recserve.train.leave_one_out import Ranker, evaluate_protocols, history_counts, popularity_score_fn

    torch.set_num_threads(2)
    raw = np.load(job["seqs"])
    seqs = Sequences(raw["items"], raw["offsets"])
    num_items = int(raw["num_items"])
    model_kw = {k: job["config"].get(k, v) for k, v in BASE_MODEL.items()}
    train_kw = {k: job["config"].get(k, v) for k, v in BASE_TRAIN.items()}
    train_kw["epochs"] = job["max_epochs"] or train_kw["epochs"]
    device, seed = job["device"], job["seed"]
    torch.manual_seed(seed)
    np.random.seed(seed)
    model = Bert4Rec(Bert4RecConfig(num_items=num_items, **model_kw)).to(device)
    cfg = model.cfg
    batches, loss = _batches(seqs.truncated(2), cfg, train_kw, seed, device)
    opt, schedule = _optimizer(model, train_kw, train_kw["epochs"] * len(batches))
    valid_in, valid_t = seqs.truncated(2), seqs.last(2)
    test_in, test_t = seqs.truncated(1), seqs.last(1)
    pop = history_counts(valid_in, cfg.vocab_size)
    common = dict(window=cfg.window, mask_index=cfg.mask_index, popularity=pop, device=device)
    valid_ranker, test_ranker = Ranker(valid_in, valid_t, **common), Ranker(test_in, test_t, **common)
    best = {"valid_ndcg@10": -1.0}
    started, stale = time.perf_counter(), 0
    for epoch in range(train_kw["epochs"]):
        batches.set_epoch(epoch)
        _epoch(model, batches, opt, schedule, loss)
        model.eval()
        valid = evaluate_protocols(model, valid_ranker, ("full",))["full"]
        if valid["ndcg@10"] > best["valid_ndcg@10"]:
            best = {
                "valid_ndcg@10": valid["ndcg@10"],
                "epoch": epoch + 1,
                "test": evaluate_protocols(model, test_ranker, ("full", "full_no_exclusion")),
            }
            stale = 0
        else:
            stale += 1
            if stale >= train_kw["patience"]:
                break
    if job.get("refit") and "epoch" in best:
        best["refit"] = _refit(job, num_items, model_kw, train_kw, seqs, best["epoch"])
    counts = history_counts(test_in, cfg.vocab_size)
    popularity = evaluate_protocols(
        popularity_score_fn(counts, device),
        Ranker(test_in, test_t, counts, cfg.window, cfg.mask_index, device=device),
        ("full", "full_no_exclusion"),
    )
    return {
        "config": job["config"],
        "seed": seed,
        "epochs_run": epoch + 1,
        "wall_s": time.perf_counter() - started,
        **best,
        "popularity": popularity,
    }


def _batches(train_seqs, cfg, train_kw: dict, seed: int, device: str):
    """recserve's Cloze batches on the device and the exact-softmax loss (the trainer's defaults)."""
    from recserve.train.batches import ClozeSettings, WindowEpochs
    from recserve.train.leave_one_out import history_counts
    from recserve.train.losses import CatalogueLoss
    from recserve.train.train_config import LossSettings

    settings = ClozeSettings(cfg.window, cfg.mask_index, cfg.mask_prob, train_kw["last_item_rate"])
    batches = WindowEpochs(train_seqs, settings, train_kw["batch_size"], train_kw["samples_per_user"], seed, device)
    loss = CatalogueLoss(
        LossSettings("full", exclude_seen=train_kw["loss_exclude_seen"]),
        history_counts(train_seqs, cfg.vocab_size),
        cfg.mask_index,
        device,
    )
    return batches, loss


def _epoch(model, batches, opt, schedule, loss) -> None:
    from recserve.train.objectives import cloze_loss

    model.train()
    for batch in batches:
        value = cloze_loss(model, batch, loss)
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()
        if schedule is not None:
            schedule.step()


def _refit(job: dict, num_items: int, model_kw: dict, train_kw: dict, seqs, epochs: int) -> dict:
    """Trains again from scratch on items[:-1] (validation item included) for the selected number of epochs."""
    import torch

    from recserve.models.bert4rec import Bert4Rec
    from recserve.models.model_configs import Bert4RecConfig
    from recserve.train.leave_one_out import Ranker, evaluate_protocols, history_counts

    device = job["device"]
    torch.manual_seed(job["seed"])
    model = Bert4Rec(Bert4RecConfig(num_items=num_items, **model_kw)).to(device)
    cfg = model.cfg
    test_in, test_t = seqs.truncated(1), seqs.last(1)
    batches, loss = _batches(test_in, cfg, train_kw, job["seed"], device)
    opt, schedule = _optimizer(model, train_kw, train_kw["epochs"] * len(batches))
    for epoch in range(epochs):
        batches.set_epoch(epoch)
        _epoch(model, batches, opt, schedule, loss)
    model.eval()
    ranker = Ranker(test_in, test_t, history_counts(test_in, cfg.vocab_size), cfg.window, cfg.mask_index, device=device)
    return {"epochs": epochs, "test": evaluate_protocols(model, ranker, ("full", "full_no_exclusion"))}


def run(args) -> None:
    import multiprocessing as mp

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    grid = GRIDS[args.grid][: args.limit] if args.limit else GRIDS[args.grid]
    jobs = [
        {
            "config": c,
            "seed": s,
            "seqs": args.seqs,
            "device": args.device,
            "max_epochs": args.max_epochs,
            "refit": args.refit,
        }
        for c, s in itertools.product(grid, [int(x) for x in args.seeds.split(",")])
    ]
    with mp.get_context("spawn").Pool(args.workers) as pool, open(out / "results.jsonl", "a") as log:
        for i, result in enumerate(pool.imap_unordered(train_one, jobs)):
            log.write(json.dumps(result) + "\n")
            log.flush()
            t = result["test"]["full"]
            print(
                f"[{i + 1}/{len(jobs)}] {result['config']} seed {result['seed']}: valid {result['valid_ndcg@10']:.4f} "
                f"test ndcg@10 {t['ndcg@10']:.4f} hr@10 {t['hr@10']:.4f} (epoch {result['epoch']}, "
                f"{result['wall_s']:.0f} s)",
                flush=True,
            )
    summarize(out / "results.jsonl")


def _refit_mean(group: list[dict], key: str) -> float:
    values = [r["refit"]["test"]["full"][key] for r in group if "refit" in r]
    return float(np.mean(values)) if values else float("nan")


def summarize(*paths: Path) -> None:
    rows = [json.loads(line) for path in paths for line in Path(path).read_text().splitlines() if line.strip()]
    by_config: dict[str, list[dict]] = {}
    for row in rows:
        by_config.setdefault(json.dumps(row["config"], sort_keys=True), []).append(row)
    print(
        "config | seeds | valid ndcg@10 | test ndcg@10 | test hr@10 | no-excl ndcg@10 | no-excl hr@10 | epoch | "
        "refit test ndcg@10 / hr@10"
    )
    table = []
    for key, group in by_config.items():
        mean = lambda f, group=group: float(np.mean([f(r) for r in group]))  # noqa: E731
        table.append(
            (
                mean(lambda r: r["valid_ndcg@10"]),
                key,
                len(group),
                mean(lambda r: r["test"]["full"]["ndcg@10"]),
                mean(lambda r: r["test"]["full"]["hr@10"]),
                mean(lambda r: r["test"]["full_no_exclusion"]["ndcg@10"]),
                mean(lambda r: r["test"]["full_no_exclusion"]["hr@10"]),
                mean(lambda r: r["epoch"]),
                _refit_mean(group, "ndcg@10"),
                _refit_mean(group, "hr@10"),
            )
        )
    for valid, key, n, ndcg, hr, ndcg_ne, hr_ne, epoch, r_ndcg, r_hr in sorted(table, reverse=True):
        print(
            f"{key} | {n} | {valid:.4f} | {ndcg:.4f} | {hr:.4f} | {ndcg_ne:.4f} | {hr_ne:.4f} | {epoch:.0f} | "
            f"refit {r_ndcg:.4f} / {r_hr:.4f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="write a prepared folder's sequences as .npz")
    exp.add_argument("--data", required=True)
    exp.add_argument("--out", required=True)
    r = sub.add_parser("run", help="train every setting of the grid")
    r.add_argument("--seqs", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--device", default="cuda")
    r.add_argument("--workers", type=int, default=4)
    r.add_argument("--seeds", default="0")
    r.add_argument("--limit", type=int, default=0, help="only the first N settings")
    r.add_argument("--grid", default="one-at-a-time", choices=sorted(GRIDS))
    r.add_argument("--refit", action="store_true", help="also retrain on items[:-1] for the best epoch count")
    r.add_argument("--max-epochs", type=int, default=0, help="cap every setting's epochs (a smoke run)")
    s = sub.add_parser("summarize", help="print the table of a results.jsonl")
    s.add_argument("results", nargs="+")
    args = parser.parse_args()
    if args.command == "export":
        export_sequences(args.data, args.out)
    elif args.command == "run":
        run(args)
    else:
        summarize(*map(Path, args.results))


if __name__ == "__main__":
    main()
