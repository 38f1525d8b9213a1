"""How much counting ties against the target moves the full-ranking metrics, for a run and for popularity.

The same scores ranked twice: the target behind every rankable item of equal score (recserve's ranks, a lower
bound) and ahead of them (only strictly higher scores counted, the ranks before 2026-12-01). The test split of
leave-one-out, both full protocols (seen items excluded, and not).

    python benchmarks/rank_ties.py --run runs/sasrec --data runs/ml100k --out ties.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from recserve.constants import PAD_INDEX
from recserve.data.datasets import load_prepared
from recserve.models.run_loader import load_run
from recserve.train.leave_one_out import history_counts, popularity_score_fn
from recserve.train.metrics import ranking_metrics
from recserve.train.tensors import SequenceTensors


def both_ranks(score_fn, inputs, targets, window: int, mask_index: int, batch: int = 256) -> dict[str, np.ndarray]:
    """Ranks of each user's target with ties against it and in its favour, under both full protocols."""
    history = SequenceTensors.from_sequences(inputs, "cpu")
    out: dict[str, list[torch.Tensor]] = {}
    for start in range(0, inputs.num_users, batch):
        users = torch.arange(start, min(start + batch, inputs.num_users))
        lengths = history.lengths[users]
        tokens = torch.cat([history.windows(users, lengths, window - 1), torch.full((len(users), 1), mask_index)], 1)
        with torch.no_grad():
            scores = score_fn(tokens).float()
        target = torch.as_tensor(targets[start : start + len(users)])
        t = scores[torch.arange(len(users)), target][:, None]
        rankable = torch.ones_like(scores, dtype=torch.bool)
        rankable[:, [PAD_INDEX, mask_index]] = False
        seen = rankable.clone().scatter_(1, history.windows(users, lengths, int(lengths.max())), False)
        seen[torch.arange(len(users)), target] = True
        for name, keep in (("full_no_exclusion", rankable), ("full", seen)):
            out.setdefault(f"{name}/ties_against", []).append(((scores >= t) & keep).sum(1) - 1)
            out.setdefault(f"{name}/ties_for", []).append(((scores > t) & keep).sum(1))
    return {k: torch.cat(v).numpy() for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    data, model = load_prepared(args.data), load_run(args.run).eval()
    model.prepare_inference()
    inputs, targets = data.sequences.truncated(1), data.sequences.last(1)
    scorers = {"model": model, "popularity": popularity_score_fn(history_counts(inputs, data.vocab.size))}
    result = {"run": str(args.run), "data": str(args.data), "users": int(inputs.num_users)}
    for name, score_fn in scorers.items():
        ranks = both_ranks(score_fn, inputs, targets, model.cfg.window, model.cfg.mask_index)
        result[name] = {
            key: {m: round(ranking_metrics(r)[m], 5) for m in ("ndcg@10", "hr@10")} for key, r in ranks.items()
        }
        result[name]["targets_tied"] = {
            key.split("/")[0]: int((ranks[key] != ranks[key.replace("against", "for")]).sum())
            for key in ranks
            if key.endswith("against")
        }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
