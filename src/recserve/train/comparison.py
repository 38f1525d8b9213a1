"""Two runs ranked on the same newest events: what a promotion's gate compares. A run trained on another
catalogue (yesterday's) is ranked by item ID, as serving would answer: the history items it does not know are
dropped, and an item it does not know can never be recommended (it scores below every item it knows, a tie
counted against the target), so a new item as the target is a miss for it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from recserve.constants import PAD_INDEX
from recserve.data.datasets import PreparedData
from recserve.errors import ConfigError, DataError
from recserve.train.leave_one_out import Ranker, ScoreFn, history_counts
from recserve.train.metrics import ranking_metrics

UNKNOWN_SCORE = -1e30  # an item the run does not know: below every score a model gives, and finite
GATE_METRIC = "ndcg@10"


@dataclass(frozen=True)
class GateResult:
    """The candidate's and the serving run's figure on the same test targets, and the verdict."""

    metric: str
    candidate: float
    serving: float
    tolerance: float  # the share of the serving run's figure the candidate may lose
    test_users: int
    protocol: str

    @property
    def passed(self) -> bool:
        return self.candidate >= self.serving * (1 - self.tolerance)

    def describe(self) -> str:
        verdict = "passes" if self.passed else "refused"
        floor = self.serving * (1 - self.tolerance)
        return (
            f"gate {verdict}: candidate {self.metric} {self.candidate:.4f} against the serving run's "
            f"{self.serving:.4f} (at least {floor:.4f} needed, tolerance {self.tolerance:g}), "
            f"{self.test_users:,} test users, {self.protocol}"
        )


def index_map(run_ids: np.ndarray, data_ids: np.ndarray) -> np.ndarray:
    """(N_data + 2,) each data index's index in the run's catalogue (0 where the run lacks the item); both
    catalogues sorted IDs, index = position + 1.

    Raises:
        DataError: the catalogues hold IDs of different types (strings against integers).
    """
    if (run_ids.dtype.kind in "OUS") != (data_ids.dtype.kind in "OUS"):
        raise DataError("the run's item IDs and the data folder's are of different types (strings and integers)")
    position = np.searchsorted(run_ids, data_ids)
    found = position < len(run_ids)
    found[found] = run_ids[position[found]] == data_ids[found]
    mapped = np.zeros(len(data_ids) + 2, dtype=np.int64)
    mapped[1:-1] = np.where(found, position + 1, PAD_INDEX)
    mapped[-1] = len(run_ids) + 1  # the mask token
    return mapped


def scores_by_id(model, mapped: np.ndarray) -> ScoreFn:
    """The model's scores in the data folder's index space: (B, L) data tokens in, (B, N_data + 2) out."""
    host = torch.as_tensor(mapped)
    known_host = torch.nonzero(host[1:-1]).flatten() + 1  # data columns the run knows
    on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def score(tokens: torch.Tensor) -> torch.Tensor:
        if tokens.device not in on_device:  # copied once, not every batch
            table, known = host.to(tokens.device), known_host.to(tokens.device)
            on_device[tokens.device] = (table, known, table[known])
        table, known, theirs = on_device[tokens.device]
        scores = model(table[tokens])
        out = torch.full((tokens.shape[0], len(table)), UNKNOWN_SCORE, dtype=scores.dtype, device=scores.device)
        out[:, known] = scores[:, theirs]
        return out

    return score


@torch.no_grad()
def evaluate_on(run_dir: Path, data: PreparedData, device: str = "cpu") -> dict:
    """The run's full-protocol metrics (every item ranked, the history excluded, ties against the target) on
    the data folder's test targets, whichever catalogue the run was trained on."""
    from recserve.artifacts.catalogue import read_catalogue
    from recserve.models.registry import model_entry
    from recserve.models.run_loader import load_run, model_name

    if not model_entry(model_name(run_dir)).sequential:
        raise ConfigError(f"{run_dir}: the gate ranks sequence models (BERT4Rec, SASRec); promote it with --no-gate")
    model = load_run(run_dir).to(device)
    model.prepare_inference()
    mapped = index_map(read_catalogue(run_dir), data.vocab.ids)
    held = data.test()
    inputs = held.inputs.where(mapped[held.inputs.items] != PAD_INDEX)  # serving drops the IDs it does not know
    counts = history_counts(inputs, data.vocab.size)
    ranker = Ranker(inputs, held.targets, counts, model.cfg.window, data.vocab.mask_index, device=device)
    ranks = ranker.ranks(scores_by_id(model, mapped), ("full",))["full"]
    return {"full": ranking_metrics(ranks), "test_users": int(len(ranks)), "known_targets": _known(mapped, held)}


def _known(mapped: np.ndarray, held) -> float:
    """The share of the test targets the run knows."""
    return round(float((mapped[held.targets] != PAD_INDEX).mean()), 4) if len(held.targets) else 0.0


def gate(candidate: Path, serving: Path, data_dir: Path, tolerance: float, device: str = "cpu") -> GateResult:
    """The candidate against the serving run on ``data_dir``'s test targets (its split: by time, as a shop lives,
    or leave-one-out)."""
    if not 0 <= tolerance < 1:
        raise ConfigError(f"tolerance {tolerance}: a share of the serving run's figure, 0 to below 1")
    from recserve.data.datasets import load_prepared

    data = load_prepared(data_dir)
    ours, theirs = evaluate_on(candidate, data, device), evaluate_on(serving, data, device)
    return GateResult(
        metric=GATE_METRIC,
        candidate=ours["full"][GATE_METRIC],
        serving=theirs["full"][GATE_METRIC],
        tolerance=tolerance,
        test_users=ours["test_users"],
        protocol=f"{data.cuts.kind} split of {data_dir}, every item ranked, ties against the target",
    )
