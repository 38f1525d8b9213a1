"""Leave-one-out evaluation on the model's device: full ranking (seen items excluded, or not) and two
sampled protocols, batched so that memory is bounded by a batch of (users x catalogue) scores.

``sampled`` is the BERT4Rec paper's protocol: the target against 100 negatives drawn by popularity, never
from the user's history. ``sampled_uniform`` is the SASRec paper's: 100 negatives drawn uniformly from the
items the user never interacted with. Both use a fixed seed (a device's own random stream: the CPU and a GPU
draw different negatives for the same seed).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np
import torch

from recserve.constants import PAD_INDEX
from recserve.data.sequences import Sequences
from recserve.errors import DataError, EvaluationError
from recserve.train.metrics import ranking_metrics
from recserve.train.tensors import SequenceTensors, widest

log = logging.getLogger(__name__)

ScoreFn = Callable[[torch.Tensor], torch.Tensor]  # (B, L) tokens -> (B, N + 2) scores
SAMPLED_NEGATIVES = 100
PROTOCOLS = ("full", "full_no_exclusion", "sampled", "sampled_uniform")
SCORES_PER_BATCH = {"cpu": 2**25, "cuda": 2**27}  # users x catalogue scores at a time: 128 MB, 512 MB (float32)


def eval_batch_size(vocab_size: int, device: str | torch.device = "cpu") -> int:
    """Users a batch, so that a batch holds about ``SCORES_PER_BATCH`` scores (1 to 4,096)."""
    budget = SCORES_PER_BATCH.get(torch.device(device).type, SCORES_PER_BATCH["cpu"])
    return int(np.clip(budget // vocab_size, 1, 4096))


class Ranker:
    """Ranks each user's target after their history, under the protocols; the data stays on ``device``."""

    def __init__(
        self,
        inputs: Sequences,
        targets: np.ndarray,
        popularity: np.ndarray,
        window: int,
        mask_index: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
    ):
        """Args:
        inputs: each user's history before the target; targets: (users,) target indices.
        popularity: (N + 2,) item counts, for drawing the popularity negatives.
        window: the model's window; the history keeps its ``window - 1`` most recent items and the mask
            token is appended.
        """
        self.device, self.window, self.mask_index, self.seed = torch.device(device), window, mask_index, seed
        self.history = SequenceTensors.from_sequences(inputs, device)
        self.lengths = inputs.lengths  # on the host: batch widths without a device round trip
        self.targets = torch.as_tensor(targets, dtype=torch.int64, device=device)
        self.weights = torch.as_tensor(popularity, dtype=torch.float32, device=device) + 1  # +1: all drawable
        self.negatives_drawn: dict[str, np.ndarray] = {}  # the last ranking's, per sampled protocol

    @property
    def user_count(self) -> int:
        return len(self.lengths)

    def ranks(
        self, score_fn: ScoreFn, protocols: tuple[str, ...] = PROTOCOLS, users: tuple[int, int] | None = None
    ) -> dict[str, np.ndarray]:
        """0-based rank of each user's target under each protocol: the count of rankable items that score at
        least as high (a tie counts against the target, so a number reported is a lower bound).

        ``users`` (first, stop) ranks only those users: a DDP rank's share of validation. The full protocols
        rank each user alike whatever the share; the sampled ones draw from one stream that starts at the
        share's first user, so only whole runs are reproducible there. ``negatives_drawn`` then holds, per
        sampled protocol, how many negatives each user got (``SAMPLED_NEGATIVES``, or all the user's
        drawable items where fewer).

        Raises:
            EvaluationError: a score of a rankable item is NaN or infinite, with the count of such users.
        """
        unknown = set(protocols) - set(PROTOCOLS)
        if unknown:
            raise DataError(f"protocols {sorted(unknown)}: expected some of {', '.join(PROTOCOLS)}")
        generator = torch.Generator(device=self.device).manual_seed(self.seed)
        first, users_total = users or (0, self.user_count)
        out: dict[str, list[torch.Tensor]] = {name: [] for name in protocols}
        drawn: dict[str, list[torch.Tensor]] = {name: [] for name in protocols if name in SAMPLED}
        bad = torch.zeros((), dtype=torch.int64, device=self.device)
        step = eval_batch_size(len(self.weights), self.device)
        for start in range(first, users_total, step):
            stop = min(start + step, users_total)
            ranks, counts, bad_rows = self._rank_batch(score_fn, start, stop, protocols, generator)
            bad += bad_rows
            for name, value in ranks.items():
                out[name].append(value)
            for name, value in counts.items():
                drawn[name].append(value)
        if int(bad):  # one host read for the whole ranking
            raise EvaluationError(
                f"{int(bad)} of {users_total - first} users got a NaN or infinite score for a rankable item: "
                "the model's scores cannot be ranked (a diverged model?)"
            )
        self.negatives_drawn = {name: _host(parts) for name, parts in drawn.items()}
        return {name: _host(parts) for name, parts in out.items()}

    @torch.no_grad()
    def _rank_batch(self, score_fn, start: int, stop: int, protocols, generator):
        users = torch.arange(start, stop, device=self.device)
        lengths = self.history.lengths[users]
        history = self.history.windows(users, lengths, self.window - 1)
        mask = torch.full((len(users), 1), self.mask_index, device=self.device)
        scores = score_fn(torch.cat([history, mask], 1)).float()  # (B, V)
        rows = torch.arange(len(users), device=self.device)
        target = self.targets[users]
        target_score = scores[rows, target][:, None]  # (B, 1)
        specials = torch.tensor([PAD_INDEX, self.mask_index], device=self.device)
        excluded = torch.zeros_like(scores, dtype=torch.bool).index_fill_(1, specials, True)
        bad_rows = (~torch.isfinite(scores) & ~excluded).any(1).sum()
        out, drawn = {}, {}
        if "full_no_exclusion" in protocols:  # the target is among the rankable: it ties with itself
            out["full_no_exclusion"] = ((scores >= target_score) & ~excluded).sum(1) - 1
        whole_history = self.history.windows(users, lengths, widest(self.lengths, start, stop))
        excluded.scatter_(1, whole_history, True)
        excluded[rows, target] = False  # a repeated target stays rankable
        if "full" in protocols:
            out["full"] = ((scores >= target_score) & ~excluded).sum(1) - 1
        excluded[rows, target] = True  # never a negative
        for name, weights in (("sampled", self.weights), ("sampled_uniform", torch.ones_like(self.weights))):
            if name in protocols:
                negatives, valid = draw_negatives(weights, excluded, SAMPLED_NEGATIVES, generator)
                out[name] = ((scores.gather(1, negatives) >= target_score) & valid).sum(1)
                drawn[name] = valid.sum(1)
        return out, drawn, bad_rows


SAMPLED = ("sampled", "sampled_uniform")


def draw_negatives(
    weights: torch.Tensor, excluded: torch.Tensor, count: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` items per row drawn without replacement with probability proportional to ``weights``,
    among the items not ``excluded``; a row with fewer such items gets all of them.

    The Gumbel top-k trick: the ``count`` largest of log(weight) + Gumbel noise are a draw without
    replacement in proportion to the weights (as ``torch.multinomial`` draws, row by row).

    Args:
        weights: (V,) positive; excluded: (B, V) True where an item may not be drawn.

    Returns:
        (B, count) item indices and (B, count) True where the slot holds a drawn item.
    """
    uniform = torch.rand(excluded.shape, generator=generator, device=excluded.device).clamp_(min=1e-12)
    keys = weights.log()[None, :] - (-uniform.log_()).log_()  # (B, V): log w + Gumbel(0, 1)
    keys.masked_fill_(excluded, -math.inf)
    top, negatives = keys.topk(min(count, keys.shape[1]), dim=1)
    return negatives, top > -math.inf


def _host(parts: list[torch.Tensor]) -> np.ndarray:
    return torch.cat(parts).cpu().numpy() if parts else np.zeros(0, np.int64)


def negatives_summary(ranker: Ranker) -> dict:
    """What the sampled protocols drew in the ranker's last ranking: per protocol the negatives asked for,
    their mean and minimum over users, and the users who had fewer drawable items than that."""
    return {
        name: {
            "requested": SAMPLED_NEGATIVES,
            "mean": round(float(counts.mean()), 3) if counts.size else 0.0,
            "min": int(counts.min()) if counts.size else 0,
            "users_below_requested": int((counts < SAMPLED_NEGATIVES).sum()),
        }
        for name, counts in ranker.negatives_drawn.items()
    }


def popularity_score_fn(counts: np.ndarray, device: str | torch.device = "cpu") -> ScoreFn:
    """Scores every user with the items' interaction counts: the baseline to beat."""
    table = torch.as_tensor(counts, dtype=torch.float32, device=device)
    return lambda tokens: table.expand(tokens.shape[0], -1)


def history_counts(inputs: Sequences, vocab_size: int) -> np.ndarray:
    """Exact interaction counts over the inputs (what a model may see before the targets)."""
    return np.bincount(inputs.items, minlength=vocab_size).astype(np.int64)


def evaluate_protocols(
    score_fn: ScoreFn, ranker: Ranker, protocols: tuple[str, ...] = PROTOCOLS
) -> dict[str, dict[str, float]]:
    """Metrics under each protocol (see ``Ranker``)."""
    return {name: ranking_metrics(r) for name, r in ranker.ranks(score_fn, protocols).items()}


def evaluate_run(run_dir, data_dir, seed: int = 0, device: str = "cpu") -> dict:
    """Test metrics of a run and of the popularity baseline under every protocol.

    The test input of each user is the whole sequence but its last item; popularity counts those inputs.
    """
    import time

    from recserve.data.datasets import load_prepared
    from recserve.models.runs import load_run

    data = load_prepared(data_dir)
    model = load_run(run_dir).to(device)
    if model.cfg.num_items != data.vocab.num_items:
        raise DataError(
            f"{data_dir}: {data.vocab.num_items} items, but the run {run_dir} was trained on {model.cfg.num_items}; "
            "evaluate on the data folder it was trained on"
        )
    model.prepare_inference()
    inputs, targets = data.sequences.truncated(1), data.sequences.last(1)
    counts = history_counts(inputs, data.vocab.size)
    ranker = Ranker(inputs, targets, counts, model.cfg.window, model.cfg.mask_index, device=device, seed=seed)
    started = time.perf_counter()
    test = evaluate_protocols(model, ranker)
    elapsed_s = time.perf_counter() - started
    drawn = negatives_summary(ranker)
    return {
        "test": test,
        "popularity": evaluate_protocols(popularity_score_fn(counts, device), ranker),
        "test_users": int(inputs.num_users),
        "sampled_negatives": drawn,
        "seed": seed,
        "eval": {"device": str(device), "seconds": round(elapsed_s, 3), "protocols": list(PROTOCOLS)},
    }
