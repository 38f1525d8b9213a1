"""New items on day one: ML-100K with its genres and years as the item table's attributes, a share of its films
left out of training entirely, ranked by a model that learns items by their attributes (``--item-attributes``)
against one that learns them by ID alone, and against two baselines that know only the attributes.

For each seed, ``--new-share`` of the films (drawn uniformly) become new: every event on them is removed except a
user's last event (the leave-one-out test target), and the item table keeps every film in the catalogue
(``recserve data --unseen-items``), so they are in the catalogue but no training event holds them. Both models
are the real `recserve train` (the defaults otherwise) in its own process; the figures are each run's
metrics.json:
- ``new_items``: the test targets that are new films, each ranked among the new films alone (seen excluded, ties
  against the target): the model, ``attribute_popularity`` (its genre's and year's training events) and
  ``attribute_profile`` (the user's own history's genres and years, ties by popularity);
- ``test_apart.model.warm``: the other targets' full-ranking NDCG@10, to see what attributes cost them.

    python benchmarks/new_items.py --seeds 0,1,2 --out new-items.json
    python benchmarks/new_items.py --log ml100k.csv --items ml100k-films.csv --device gpu --parallel 3 \
        --out new-items.json
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from warm_start import recserve  # `recserve ARGS` in its own process, timed (this folder's sibling script)

EPOCHS = 0  # --epochs: 0 trains with the defaults
VARIANTS = {  # each variant's own options of `recserve train`; id_only is the baseline every ratio reads
    "id_only": ("--no-item-attributes",),
    "attributes": ("--item-attributes",),
    "attributes_id_dropout": ("--item-attributes", "--id-dropout", "0.2"),
}


def prepare(work: Path, seed: int, share: float, log: Path | None, items: Path | None) -> dict:
    """Writes the log with the new films' earlier events removed, the item table, and the data folder."""
    import polars as pl

    from recserve.data.io import read_ml100k, read_table

    if log is None or items is None:
        frame, titles = read_ml100k()
        assert titles is not None, "the ML-100K copy has no item file"
    else:
        frame, titles = read_table(log), pl.read_csv(items)
    films = np.sort(frame["item_id"].unique().to_numpy())
    rng = np.random.default_rng(seed)
    new = rng.choice(films, size=round(share * len(films)), replace=False)
    frame = frame.sort(["user_id", "timestamp"], maintain_order=True)
    last = pl.int_range(pl.len()).over("user_id") == pl.len().over("user_id") - 1
    kept = frame.filter(~pl.col("item_id").is_in(new.tolist()) | last)
    folder = work / f"seed-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    kept.write_csv(folder / "log.csv")
    titles.select("item_id", "genre", "year").write_csv(folder / "films.csv")
    recserve(  # the films no event names stay in the catalogue, as a shop's new items
        "data",
        str(folder / "log.csv"),
        "--items",
        str(folder / "films.csv"),
        "--unseen-items",
        "--out",
        str(folder / "data"),
    )
    info = json.loads((folder / "data" / "dataset.json").read_text())
    return {"films": len(films), "new_films": len(new), "events": info["interactions"], "users": info["users"]}


def one_seed(
    work: Path, seed: int, share: float, device: str, model: str, log: Path | None, items: Path | None
) -> dict:
    out: dict = {"seed": seed, "data": prepare(work, seed, share, log, items)}
    data = work / f"seed-{seed}" / "data"
    for name, flags in VARIANTS.items():
        run = work / f"seed-{seed}" / name
        seconds = recserve(
            "train", "--data", str(data), "--out", str(run), "--seed", str(seed), "--device", device, "--model", model,
            *flags, "--overwrite", *(("--epochs", str(EPOCHS)) if EPOCHS else ()),
        )  # fmt: skip
        metrics = json.loads((run / "metrics.json").read_text())
        new = metrics.get("new_items") or {}
        out[name] = {
            "seconds": round(seconds, 1),
            "new_items": new,
            "others_ndcg@10": metrics["test_apart"]["model"]["warm"]["full"]["ndcg@10"],
            "ndcg@10": metrics["test"]["full"]["ndcg@10"],
        }
    print(json.dumps(out), flush=True)
    return out


def summary(rows: list[dict]) -> dict:
    """Means over the seeds of each variant, and the paired ratios to the ID-only model that the targets read:
    HR@10 among the new items against the attribute baselines, the other targets' NDCG@10 against ID-only."""

    def mean(values) -> float:
        return float(np.mean(list(values)))

    hr = lambda run, who: run["new_items"][who]["hr@10"]  # noqa: E731
    ids = [r["id_only"] for r in rows]
    out: dict = {
        "new_targets": mean(r["new_items"]["targets"] for r in ids),
        "baselines_hr@10_among_new": {
            who: mean(hr(r, who) for r in ids) for who in ("attribute_popularity", "attribute_profile")
        },
    }
    for name in VARIANTS:
        runs = [r[name] for r in rows]
        out[name] = {
            "hr@10_among_new": mean(hr(r, "model") for r in runs),
            "hr@10_per_seed": [hr(r, "model") for r in runs],
            "others_ndcg@10": mean(r["others_ndcg@10"] for r in runs),
            "others_ndcg_ratio_per_seed": [r["others_ndcg@10"] / i["others_ndcg@10"] for r, i in zip(runs, ids)],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2", help="seeds: each draws its own new films and trains with it")
    parser.add_argument("--new-share", type=float, default=0.1, help="share of the films left out of training")
    parser.add_argument("--model", default="sasrec")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--work", type=Path, default=Path("/tmp/recserve-new-items"))
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--log", type=Path, help="the ML-100K log as CSV (default: the copy recserve reads)")
    parser.add_argument("--items", type=Path, help="its films as CSV: item_id, genre, year (with --log)")
    parser.add_argument("--parallel", type=int, default=1, help="seeds run at once (on a GPU they share it)")
    parser.add_argument("--epochs", type=int, default=0, help="at most this many epochs (0: the defaults)")
    args = parser.parse_args()
    global EPOCHS
    EPOCHS = args.epochs
    seeds = [int(s) for s in args.seeds.split(",")]
    with ThreadPoolExecutor(args.parallel) as pool:
        rows = list(
            pool.map(
                lambda s: one_seed(args.work, s, args.new_share, args.device, args.model, args.log, args.items), seeds
            )
        )
    result = {"model": args.model, "new_share": args.new_share, "device": args.device, "seeds": rows,
              "summary": summary(rows)}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
