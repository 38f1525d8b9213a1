"""What an 8-bit output layer costs in accuracy: a trained run's test ranking (full, seen items excluded, ties
against the target) with the output layer's item table stored at lower precision, each row scaled to its own
largest value (int8: symmetric, 127 levels; fp8: e4m3, the row's largest value at 448), the query and the bias
as the model makes them; and `fp8-served`, the product as the export's precision fp8 serves it
(`recserve.models.output_table`: the query quantized a row at a time as well, `torch._scaled_mm`). Printed and
written as JSON.

    python benchmarks/output_layer_8bit.py --run runs/video-seeds/refit-seed0 --data runs/video --out o.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from recserve.data.datasets import load_prepared
from recserve.models.output_table import MULTIPLE, dequantized, quantize_rows, scaled_product
from recserve.models.run_loader import load_run
from recserve.train.leave_one_out import Ranker, history_counts
from recserve.train.metrics import ranking_metrics

PRECISIONS = ("fp32", "bf16", "int8", "fp8", "fp8-served")


def stored(table: torch.Tensor, precision: str) -> torch.Tensor:
    """``table`` (V, H) float32 as the output layer would store it at ``precision``, read back as float32."""
    if precision == "fp32":
        return table
    if precision == "bf16":
        return table.bfloat16().float()
    if precision == "int8":
        scale = table.abs().amax(1, keepdim=True).clamp(min=1e-12)  # (V, 1): each row its own
        return (table / scale * 127).round().clamp(-127, 127) / 127 * scale
    if precision in ("fp8", "fp8-served"):
        return dequantized(*quantize_rows(table))
    raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")


def scorer(model, table: torch.Tensor, bias: torch.Tensor, precision: str):
    """The scores of a batch of tokens with the table at ``precision``."""
    if precision == "fp8-served":
        rows, scale = quantize_rows(table, MULTIPLE)
        return lambda tokens: scaled_product(model.query(tokens), rows, scale.T)[:, : len(bias)] + bias
    output = stored(table, precision)
    return lambda tokens: model.query(tokens) @ output.T + bias


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    data = load_prepared(args.data)
    model = load_run(args.run).eval()
    model.prepare_inference()
    held = data.test()
    ranker = Ranker(
        held.inputs,
        held.targets,
        history_counts(held.inputs, data.vocab.size),
        model.cfg.window,
        model.cfg.mask_index,
    )
    table, bias = model.item_vectors().detach().float(), model.item_bias().detach().float()
    rows, reference = [], None
    with torch.no_grad():
        for precision in args.precisions.split(","):
            ranks = ranker.ranks(scorer(model, table, bias, precision), ("full",))["full"]
            reference = ranks if reference is None else reference
            metrics = ranking_metrics(ranks)
            rows.append(
                {
                    "precision": precision,
                    "bytes_per_item": {"fp32": 4, "bf16": 2}.get(precision, 1) * table.shape[1]
                    + (4 if precision not in ("fp32", "bf16") else 0),
                    "ndcg@10": round(metrics["ndcg@10"], 5),
                    "hr@10": round(metrics["hr@10"], 5),
                    "ranks_alike": round(float((ranks == reference).mean()), 5),
                    "table_error": round(float((stored(table, precision) - table).norm() / table.norm()), 6),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    settings = {"run": str(args.run), "data": str(args.data), "users": len(held.targets), "protocol": "full"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": settings, "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
