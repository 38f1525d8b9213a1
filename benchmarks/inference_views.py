"""Test-time augmentation for trained SASRec or BERT4Rec runs: each user's history is ranked with the mean of
the model's queries over several views of it, the history itself and views with some of its items left out
(Dang et al., "Data Augmentation as Free Lunch: Exploring the Test-Time Augmentation for Sequential
Recommendation", SIGIR 2025: their TMask-B and TMask-R). The output layer is linear in the query, so the mean
of the views' scores is the score of their mean query: a view costs one more pass of the encoder, not of the
catalogue. Nothing is trained again.

A view leaves out a fixed pattern of positions counted from the newest item (the same for every user, so a
served graph would hold it as a constant), never the newest item itself. View j of V - 1 leaves out each
position with probability drop x j / (V - 1), so the views range from light to heavy. ``pad`` puts padding
where an item was (attention skips it, the others keep their positions); ``remove`` closes the gap.

Leave-one-out test split, full and served protocols, ties against the target, as `recserve evaluate` ranks.
Each run and variant is one line of ``--out`` (JSONL, the shape `train_seeds.py` writes), so the paired
table against the runs as they are comes from

    python benchmarks/inference_views.py --data runs/demo/data --runs runs/seeds/default-seed* \\
        --variants pad:4:0.2,remove:4:0.2,pad:8:0.4 --out views.jsonl
    python benchmarks/train_seeds.py --tabulate views.jsonl --baseline views.jsonl:plain
"""

from __future__ import annotations

import argparse
import json
import time
import types
from pathlib import Path

import torch

from recserve.constants import PAD_INDEX
from recserve.data.datasets import load_prepared
from recserve.errors import DataError
from recserve.models.run_loader import load_run
from recserve.models.transformer import ItemTransformer
from recserve.train.leave_one_out import Ranker, evaluate_protocols, history_counts
from recserve.train.run_writer import trained_on

MODES = ("pad", "remove")
PROTOCOLS = ("full", "served")


def parse_variant(spec: str) -> tuple[str, int, float]:
    """MODE:VIEWS:DROP, e.g. pad:4:0.2."""
    try:
        mode, views, drop = spec.split(":")
        parsed = (mode, int(views), float(drop))
    except ValueError:
        raise SystemExit(f"--variants {spec!r}: expected MODE:VIEWS:DROP, e.g. pad:4:0.2") from None
    if mode not in MODES or parsed[1] < 2 or not 0 < parsed[2] < 1:
        raise SystemExit(f"--variants {spec!r}: MODE one of {', '.join(MODES)}, VIEWS 2 or more, DROP in (0, 1)")
    return parsed


def left_out(views: int, drop: float, width: int, seed: int = 0) -> torch.Tensor:
    """(views - 1, width) bool: the positions each extra view leaves out, the newest (last) never."""
    generator = torch.Generator().manual_seed(seed)
    shares = drop * torch.arange(1, views) / (views - 1)
    out = torch.rand(views - 1, width, generator=generator) < shares[:, None]
    out[:, -1] = False
    return out


def with_views(model: ItemTransformer, mode: str, views: int, drop: float) -> ItemTransformer:
    """``model`` whose ``query`` is the mean of its own over the history's views (this instance only)."""
    own = type(model).query
    pattern = left_out(views, drop, model.cfg.window)

    def query(self, tokens: torch.Tensor) -> torch.Tensor:
        history, mask = tokens[:, :-1], tokens[:, -1:]
        gone = pattern[:, pattern.shape[1] - history.shape[1] :].to(tokens.device)  # right-aligned
        queries = [own(self, tokens)]
        for leave in gone:
            leave = leave[None] & (history != PAD_INDEX)
            view = history.masked_fill(leave, PAD_INDEX)
            if mode == "remove":  # the kept items move right, in order; the padding before them
                view = view.gather(1, torch.argsort((~leave).int(), dim=1, stable=True))
            queries.append(own(self, torch.cat([view, mask], 1)))
        return torch.stack(queries).mean(0)

    model.query = types.MethodType(query, model)  # type: ignore[method-assign]
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the data folder the runs were trained on")
    parser.add_argument("--runs", nargs="+", type=Path, required=True, help="trained SASRec or BERT4Rec runs")
    parser.add_argument(
        "--variants",
        default="pad:4:0.2,remove:4:0.2,pad:8:0.4",
        help="MODE:VIEWS:DROP, comma-separated (MODE pad or remove; VIEWS counts the history itself)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, required=True, help="JSONL, appended to")
    args = parser.parse_args()
    variants = [parse_variant(s) for s in args.variants.split(",")]
    data = load_prepared(args.data)
    inputs, targets = data.sequences.truncated(1), data.sequences.last(1)
    counts = history_counts(inputs, data.vocab.size)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for run in args.runs:
        try:
            record = trained_on(run, data, args.data)  # refuses another data folder, naming what differs
        except DataError as err:
            raise SystemExit(str(err)) from None
        if record is None:
            raise SystemExit(f"{run}: no run.json, so neither its data nor its seed can be checked")
        model = load_run(run).to(args.device)
        if not isinstance(model, ItemTransformer):
            raise SystemExit(f"{run}: a {type(model).__name__} run; views are for SASRec and BERT4Rec")
        model.prepare_inference()
        ranker = Ranker(inputs, targets, counts, model.cfg.window, model.cfg.mask_index, args.device)
        for variant in [None, *variants]:  # plain first: each variant's views then replace the last one's
            name = "plain" if variant is None else "{}-v{}-d{}".format(*variant)
            if variant is not None:
                with_views(model, *variant)
            started = time.perf_counter()
            with torch.no_grad():
                test = evaluate_protocols(model, ranker, PROTOCOLS)
            row = {"variant": name, "seed": record["train"]["seed"], "run": str(run), "data": str(args.data)}
            row |= {"test": test, "eval_s": round(time.perf_counter() - started, 2)}
            print(f"{run.name} {name}: NDCG@10 full {test['full']['ndcg@10']:.4f}", flush=True)
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
