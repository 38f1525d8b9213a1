"""What an ensemble of SASRec or BERT4Rec runs (the same settings, other seeds) would rank: each member's test
NDCG@10 and the ensemble's, whose scores are the mean of its members' scores (the mean of their log
probabilities ranks the same: a row's log-sum-exp is one constant a row). Leave-one-out test split, full
protocol, ties against the target, as `recserve evaluate` ranks. Printed, and written as JSON.

    python benchmarks/seed_ensemble.py --data runs/demo/data --ensemble runs/s0,runs/s1 \\
        --ensemble runs/s2,runs/s3 --out ensembles.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from recserve.data.datasets import load_prepared
from recserve.models.run_loader import load_run
from recserve.train.leave_one_out import Ranker, history_counts
from recserve.train.metrics import ranking_metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--ensemble", action="append", required=True, help="RUN,RUN,...: the members of one ensemble")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    data = load_prepared(args.data)
    inputs, targets = data.sequences.truncated(1), data.sequences.last(1)
    rows = []
    for group in args.ensemble:
        members = [load_run(Path(run)).to(args.device) for run in group.split(",")]
        for model in members:
            model.prepare_inference()
        cfg = members[0].cfg
        ranker = Ranker(
            inputs, targets, history_counts(inputs, data.vocab.size), cfg.window, cfg.mask_index, args.device
        )

        def ndcg(score_fn, ranker=ranker) -> float:
            with torch.no_grad():
                return ranking_metrics(ranker.ranks(score_fn, ("full",))["full"])["ndcg@10"]

        singles = [ndcg(model) for model in members]
        together = ndcg(lambda tokens, members=members: torch.stack([m(tokens) for m in members]).mean(0))
        rows.append({"members": group.split(","), "member_ndcg@10": singles, "ensemble_ndcg@10": together})
        print(
            f"{group}: members {', '.join(f'{s:.4f}' for s in singles)}; ensemble {together:.4f} "
            f"(x{together / np.mean(singles):.3f} their mean)",
            flush=True,
        )
    gains = np.array([r["ensemble_ndcg@10"] - np.mean(r["member_ndcg@10"]) for r in rows])
    summary = {
        "ensembles": len(rows),
        "ratio_to_members_mean": float(
            np.mean([r["ensemble_ndcg@10"] for r in rows]) / np.mean([np.mean(r["member_ndcg@10"]) for r in rows])
        ),
        "paired_t": float(gains.mean() / (gains.std(ddof=1) / np.sqrt(len(gains)))) if len(gains) > 1 else None,
    }
    print(json.dumps(summary))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"protocol": "leave-one-out test, full, ties against the target", "rows": rows, "summary": summary},
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
