"""Parity of an export against eager fp32 PyTorch, on shapes other than the traced ones."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recserve.errors import ExportError
from recserve.export.graph import GraphSpec, example_inputs

TOP = 10
FP32_SCORE_TOL = 1e-3  # absolute, on logits of magnitude ~10: far above fp32 reordering noise


def validation_cases(spec: GraphSpec, fixed_length: int | None = None) -> list[tuple[int, int]]:
    """(batch, padded length) pairs: 1, 3 and 64 requests; odd lengths, one item, and the full window.

    Histories inside each case have random lengths up to the padded length (``example_inputs``).
    """
    full = spec.window - 1
    cases = [(1, min(7, full)), (3, min(23, full)), (64, full), (5, 1), (17, max(1, full // 2 + 1))]
    return [(batch, fixed_length or length) for batch, length in cases]


@dataclass(frozen=True)
class Parity:
    max_score_diff: float  # over the top-10 positions
    top10_overlap: float  # mean share of the reference top 10 that the export also returns
    same_top10: bool  # identical top-10 IDs wherever the reference scores are not tied within the tolerance


def compare(ref: tuple[np.ndarray, np.ndarray], got: tuple[np.ndarray, np.ndarray], tol: float) -> Parity:
    ref_ids, ref_scores = ref[0][:, :TOP], ref[1][:, :TOP]
    got_ids, got_scores = got[0][:, :TOP], got[1][:, :TOP]
    # past the items a row's rules (or a small catalogue) let through, scores are -inf and the IDs filler: only
    # the reference's finite positions count, and the export must score those alike
    finite = np.isfinite(ref_scores)
    diff = float(np.max(np.abs(np.where(finite, ref_scores - got_scores, 0.0)), initial=0.0))
    overlap = np.mean([len(set(a[f]) & set(b[f])) / max(int(f.sum()), 1) for a, b, f in zip(ref_ids, got_ids, finite)])
    # a swap is a tie when the reference scores of the swapped positions are within the tolerance
    swapped = (ref_ids != got_ids) & finite
    tied = np.abs(ref_scores - got_scores) <= tol
    return Parity(diff, float(overlap), bool(np.all(~swapped | tied)))


def check_parity(
    reference, runner, spec: GraphSpec, precision: str, fixed_length: int | None = None, rules: bool = True
) -> dict:
    """Runs every validation case, with business rules (``example_rules``: masks, excluded and included items) unless
    ``rules`` is False (a graph that takes none); fp32 must match within ``FP32_SCORE_TOL``, reduced
    precision reports.

    Raises:
        ExportError: fp32 outputs differ, with the max difference and the tolerance.
    """
    results = []
    for seed, (batch, length) in enumerate(validation_cases(spec, fixed_length)):
        inputs = [t.numpy() for t in example_inputs(spec, batch, length, seed=100 + seed)][: 7 if rules else 3]
        k = TOP if seed % 2 else None  # every other case asks for the top 10 only, as most requests do
        ref, got = reference(*inputs), runner(*inputs, k=k)
        if k is not None and got[0].shape[1] < min(k, ref[0].shape[1]):
            raise ExportError(f"asked for the top {k}, the export returned {got[0].shape[1]} columns")
        parity = compare(ref, got, FP32_SCORE_TOL)
        results.append({"batch": batch, "length": length, "k": k, **parity.__dict__})
        if precision == "fp32" and (parity.max_score_diff > FP32_SCORE_TOL or not parity.same_top10):
            raise ExportError(
                f"parity failed at batch {batch}, length {length}: max score difference "
                f"{parity.max_score_diff:.2e} (tolerance {FP32_SCORE_TOL:.0e}), "
                f"top-10 overlap {parity.top10_overlap:.3f}"
            )
    return {
        "cases": results,
        "max_score_diff": max(r["max_score_diff"] for r in results),
        "top10_overlap": float(np.mean([r["top10_overlap"] for r in results])),
        "score_tolerance": FP32_SCORE_TOL if precision == "fp32" else None,
    }


def served_ndcg10(runners: tuple, spec: GraphSpec, data_dir: Path, batch_size: int = 256) -> list[float]:
    """Validation NDCG@10 of each runner's served answers (seen items excluded) on the prepared data folder:
    every user's second-to-last item as the target, the items before it as the request; one pass over the
    users, every runner answering the same batches."""
    from recserve.data.datasets import load_prepared

    sequences = load_prepared(data_dir).sequences
    inputs, targets = sequences.truncated(2), sequences.last(2)
    gains: list[list[np.ndarray]] = [[] for _ in runners]
    limit = spec.window - 1
    for start in range(0, inputs.num_users, batch_size):
        users = np.arange(start, min(start + batch_size, inputs.num_users))
        indices = inputs.windows(users, inputs.lengths[users], limit)
        ids = indices if spec.id_mapping == "predictor" else np.where(indices > 0, spec.vocab_ids[indices - 1], 0)
        lengths = np.minimum(inputs.lengths[users], limit)
        target_ids = targets[users] if spec.id_mapping == "predictor" else spec.vocab_ids[targets[users] - 1]
        for runner, runner_gains in zip(runners, gains):
            top_ids, _ = runner(ids.astype(np.int64), lengths.astype(np.int64), np.ones(len(users), dtype=bool))
            hit = top_ids[:, :TOP] == target_ids[:, None]
            runner_gains.append((hit / np.log2(np.arange(TOP) + 2)).sum(1))
    return [float(np.mean(np.concatenate(g))) for g in gains]
