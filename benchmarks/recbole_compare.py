"""recserve's BERT4Rec beside RecBole's BERT4Rec and SASRec on ML-100K: same leave-one-out split (users
with at least 5 interactions, every rating an interaction, last item test, second to last validation), full
ranking, HR@10 and NDCG@10 without and with seen-item exclusion.

RecBole needs its own environment (numpy < 2, setuptools < 70; docs/quality.md says how). This script
trains the RecBole models there and ranks their test users twice: as RecBole does (nothing excluded) and
with each user's whole history excluded, as recserve evaluates and serves. recserve's side comes from run folders that
`recserve train` wrote (their metrics.json), or is trained here with --train-ours.

    .venv-recbole/bin/python benchmarks/recbole_compare.py --recbole SASRec:50:6 --recbole BERT4Rec:200:1 \\
        --ours runs/bert4rec --out benchmarks/results/quality
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # RecBole 1.2.1 saves whole objects


def recbole_config(model: str, window: int, epochs: int, device: str, out: Path) -> dict:
    import recbole

    return {
        "data_path": str(Path(recbole.__file__).parent / "dataset_example"),
        "load_col": {"inter": ["user_id", "item_id", "timestamp"]},
        "user_inter_num_interval": "[5,inf)",
        "eval_args": {"split": {"LS": "valid_and_test"}, "order": "TO", "mode": "full", "group_by": "user"},
        "train_neg_sample_args": None,
        "loss_type": "CE",
        "MAX_ITEM_LIST_LENGTH": window,
        "epochs": epochs,
        "stopping_step": 10,
        "train_batch_size": 256,
        "eval_batch_size": 256,
        "metrics": ["Hit", "NDCG"],
        "topk": [10],
        "valid_metric": "NDCG@10",
        "show_progress": False,
        "checkpoint_dir": str(out / "recbole-checkpoints"),
        "device": device,
        "use_gpu": device != "cpu",
        "seed": 2020,
    }


def rank_recbole_test(model, test_data, history, device: str) -> tuple[np.ndarray, np.ndarray]:
    """0-based test ranks with nothing excluded (RecBole's protocol) and with the user's whole history
    excluded (recserve's protocol; ``history`` is a (users, items) bool matrix of every interaction)."""
    import torch

    plain, excluded = [], []
    model.eval()
    with torch.no_grad():
        for interaction, _, positive_u, positive_i in test_data:
            scores = model.full_sort_predict(interaction.to(device)).view(len(interaction), -1).float().cpu()
            scores[:, 0] = -torch.inf  # RecBole's padding item
            target = scores[positive_u, positive_i]
            plain.append((scores[positive_u] > target[:, None]).sum(1).numpy())
            seen = history[interaction["user_id"].cpu()].clone()  # (B, items)
            seen[positive_u, positive_i] = False  # a repeated target stays rankable
            masked = scores.masked_fill(seen, -torch.inf)
            excluded.append((masked[positive_u] > target[:, None]).sum(1).numpy())
    return np.concatenate(plain), np.concatenate(excluded)


def run_recbole(spec: str, device: str, out: Path) -> dict:
    import torch
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation
    from recbole.utils import get_model, get_trainer, init_seed

    from recserve.train.metrics import ranking_metrics

    name, window, epochs = spec.split(":")
    config = Config(
        model=name, dataset="ml-100k", config_dict=recbole_config(name, int(window), int(epochs), device, out)
    )
    init_seed(config["seed"], config["reproducibility"])
    dataset = create_dataset(config)
    history = torch.zeros(dataset.user_num, dataset.item_num, dtype=torch.bool)
    history[dataset.inter_feat["user_id"], dataset.inter_feat["item_id"]] = True  # before the split: everything
    train_data, valid_data, test_data = data_preparation(config, dataset)
    model = get_model(config["model"])(config, train_data.dataset).to(config["device"])
    trainer = get_trainer(config["MODEL_TYPE"], config["model"])(config, model)
    started = time.perf_counter()
    trainer.fit(train_data, valid_data, saved=True, show_progress=False)
    wall_s = time.perf_counter() - started
    model.load_state_dict(torch.load(trainer.saved_model_file, map_location=config["device"])["state_dict"])
    plain, excluded = rank_recbole_test(model, test_data, history, config["device"])
    return {
        "name": f"RecBole {name}, window {window}",
        "training": f"{epochs} epochs max ({device})",
        "no_exclusion": ranking_metrics(plain),
        "seen_excluded": ranking_metrics(excluded),
        "wall_s": round(wall_s, 1),
        "test_users": len(plain),
    }


def ours_from_run(run_dir: Path) -> list[dict]:
    metrics = json.loads((Path(run_dir) / "metrics.json").read_text())
    train = metrics.get("train", {})
    refit = " + refit" if "refit" in metrics else ""
    model = (
        json.loads((Path(run_dir) / "model_config.json").read_text())
        if (Path(run_dir) / "model_config.json").exists()
        else {}
    )
    size = f"hidden {model['hidden']}, {model['layers']} block(s)" if model else Path(run_dir).name
    name = f"recserve BERT4Rec ({size})"
    row = {
        "name": name,
        "training": f"best epoch {metrics.get('best_epoch')}{refit}, lr {train.get('lr')}",
        "no_exclusion": metrics["test"]["full_no_exclusion"],
        "seen_excluded": metrics["test"]["full"],
        "test_users": metrics.get("test_users"),
    }
    pop = {
        "name": "popularity (exact counts)",
        "training": "-",
        "no_exclusion": metrics["popularity"]["full_no_exclusion"],
        "seen_excluded": metrics["popularity"]["full"],
        "test_users": metrics.get("test_users"),
    }
    return [pop, row]


def train_ours(data_dir: Path, out: Path) -> Path:
    from recserve.artifacts.run_metrics import merge_metrics
    from recserve.train.leave_one_out import evaluate_run
    from recserve.train.trainer import TrainConfig, train

    run = out / "recserve-small"
    started = time.perf_counter()
    merge_metrics(run, train(data_dir, run, {}, TrainConfig(resume=False)))
    merge_metrics(run, evaluate_run(run, data_dir) | {"wall_s": round(time.perf_counter() - started, 1)})
    return run


def write_table(rows: list[dict], out: Path) -> str:
    lines = [
        "| model | training | no exclusion HR@10 / NDCG@10 | seen excluded HR@10 / NDCG@10 | test users |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        cell = lambda m: f"{m['hr@10']:.3f} / {m['ndcg@10']:.3f}"  # noqa: E731
        lines.append(
            f"| {r['name']} | {r['training']} | {cell(r['no_exclusion'])} | {cell(r['seen_excluded'])} | "
            f"{r.get('test_users')} |"
        )
    table = "\n".join(lines) + "\n"
    (out / "comparison.md").write_text(table)
    (out / "comparison.json").write_text(json.dumps(rows, indent=2) + "\n")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recbole", action="append", default=[], help="MODEL:WINDOW:EPOCHS, e.g. SASRec:50:6")
    parser.add_argument("--ours", action="append", default=[], type=Path, help="a recserve run folder to include")
    parser.add_argument("--train-ours", type=Path, help="train recserve's default BERT4Rec on this data folder")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.ours = [p.resolve() for p in args.ours]
    runs = list(args.ours) + ([train_ours(args.train_ours, args.out)] if args.train_ours else [])
    rows = []
    for i, run in enumerate(runs):
        rows += ours_from_run(run)[0 if i == 0 else 1 :]  # popularity once
    os.chdir(args.out)  # RecBole writes its logs into the working folder
    for spec in args.recbole:
        rows.append(run_recbole(spec, args.device, args.out))
        write_table(rows, args.out)  # keep what finished if a later model fails
    print(write_table(rows, args.out))


if __name__ == "__main__":
    main()
