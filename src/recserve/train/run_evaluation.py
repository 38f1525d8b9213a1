"""A run's test metrics through one entry point: the protocol follows the model's task (leave-one-out over
every item for the sequence models, held-out users for Mult-VAE)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from recserve.constants import VALIDATED_WEIGHTS_FILE
from recserve.models.registry import HELD_OUT_USERS as HELD_OUT_USERS_PROTOCOL
from recserve.models.registry import model_entry
from recserve.models.run_loader import model_name


@dataclass(frozen=True)
class EvaluationSplit:
    """How a model's test split is made, and the metrics its table shows first."""

    description: str
    headline: tuple[str, ...]
    protocols: str  # what each protocol of the results means


LEAVE_ONE_OUT = EvaluationSplit(
    "leave-one-out",
    ("hr@10", "ndcg@10", "hr@20", "ndcg@20", "mrr"),
    "full: every item ranked, the whole history excluded (a repeated target stays rankable); served: what "
    "serving ranks, only the window's items excluded (a target among them is a miss); sampled: against 100 "
    "popularity-drawn negatives; sampled_uniform: against 100 uniformly drawn unseen items; ties count "
    "against the target",
)
HELD_OUT_USERS = EvaluationSplit(
    "held-out test users, 80% of items fed",
    ("recall@20", "recall@50", "ndcg@100"),
    "heldout: every item ranked for each test user, the fed items excluded (the Mult-VAE paper's protocol)",
)


def split_of(run_dir: Path) -> EvaluationSplit:
    """The test split of the run's model."""
    return HELD_OUT_USERS if model_entry(model_name(run_dir)).protocol == HELD_OUT_USERS_PROTOCOL else LEAVE_ONE_OUT


def evaluate_test(run_dir: Path, data_dir: Path, seed: int = 0, device: str = "cpu") -> dict:
    """The run's test metrics under its model's protocol (``split_of``): what metrics.json records. A refit
    run's (``--refit``, leave-one-out only) add ``test_validated``: the same protocols ranked with the weights
    validation chose, kept beside the refit, so that the run itself says what refitting bought."""
    if split_of(run_dir) is HELD_OUT_USERS:
        from recserve.train.heldout import evaluate_heldout_run

        return evaluate_heldout_run(run_dir, data_dir, device=device)
    from recserve.train.leave_one_out import evaluate_run

    validated = VALIDATED_WEIGHTS_FILE if (Path(run_dir) / VALIDATED_WEIGHTS_FILE).is_file() else None
    return evaluate_run(run_dir, data_dir, seed=seed, device=device, validated=validated)
