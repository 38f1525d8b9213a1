"""The Mult-VAE paper's protocol: held-out users, part of each one's items fed in, the rest to predict.

Users are split at random into training, validation and test users. A training user's whole item set is one
training example. Each held-out user's items are split at random: 80% are fed to the model, 20% are the
targets, ranked against every item with the fed ones excluded. Held-out items that no training user has are
dropped, as in the paper (nothing could have been learnt about them). Metrics: Recall@20, Recall@50 (hits
over min(k, targets)) and NDCG@100.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import IterableDataset

from recserve.constants import PAD_INDEX
from recserve.data.sequences import Sequences
from recserve.errors import DataError, EvaluationError
from recserve.models.multvae import Bag
from recserve.train.leave_one_out import ScoreFn, eval_batch_size, popularity_score_fn
from recserve.train.tensors import SequenceTensors, row_contains, widest

FED_SHARE = 0.8  # of each held-out user's items, fed to the model; the rest are the targets
RECALL_KS = (20, 50)
NDCG_KS = (100,)


@dataclass(frozen=True)
class FoldIn:
    """Held-out users: what the model is given and what it must find."""

    fed: Sequences  # each user's fed items
    targets: Sequences  # each user's items to predict

    def share(self, first: int, stop: int) -> FoldIn:
        """The users ``first`` to ``stop`` (exclusive), for one of several processes."""
        users = np.arange(first, stop)
        return FoldIn(self.fed.select(users), self.targets.select(users))


@dataclass(frozen=True)
class HeldOutSplit:
    train: Sequences  # the training users' whole item sets
    valid: FoldIn
    test: FoldIn


def split_heldout(
    seq: Sequences, heldout_share: float = 0.1, fed_share: float = FED_SHARE, seed: int = 0
) -> HeldOutSplit:
    """Splits users into training, validation and test users (``heldout_share`` each for the last two).

    Raises:
        DataError: too few users to hold any out, or no training user left.
    """
    seq = seq.unique_items()
    rng = np.random.default_rng(seed)
    users = rng.permutation(seq.num_users)
    n_heldout = int(round(heldout_share * seq.num_users))
    if n_heldout < 1 or seq.num_users - 2 * n_heldout < 1:
        raise DataError(
            f"{seq.num_users} users: too few to hold out {heldout_share:.0%} for validation and for test "
            "and keep some for training"
        )
    valid_users, test_users = np.sort(users[:n_heldout]), np.sort(users[n_heldout : 2 * n_heldout])
    train = seq.select(np.sort(users[2 * n_heldout :]))
    known = np.zeros(int(seq.items.max(initial=0)) + 1, dtype=bool)
    known[train.items] = True
    return HeldOutSplit(
        train,
        _fold_in(seq.select(valid_users), known, fed_share, rng),
        _fold_in(seq.select(test_users), known, fed_share, rng),
    )


def _fold_in(seq: Sequences, known: np.ndarray, fed_share: float, rng: np.random.Generator) -> FoldIn:
    seq = seq.where(known[seq.items])
    owner = np.repeat(np.arange(seq.num_users), seq.lengths)
    order = np.lexsort((rng.random(len(seq.items)), owner))  # a random order within each user
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order)) - np.repeat(seq.offsets[:-1], seq.lengths)
    n_targets = np.floor(seq.lengths * (1 - fed_share) + 1e-9).astype(np.int64)  # the paper's int(0.2 * n)
    is_target = rank < n_targets[owner]
    return FoldIn(fed=seq.where(~is_target), targets=seq.where(is_target))


def heldout_metrics(hits: torch.Tensor, n_targets: torch.Tensor) -> dict[str, float]:
    """Recall@20/50 and NDCG@100 from the top-ranked list's hits.

    Args:
        hits: (B, K) 1 where the item at rank r (0-based) is a target; K >= the largest cut-off.
        n_targets: (B,) targets per user (users without targets are not counted).

    Returns:
        Recall@k = hits in the top k / min(k, targets); NDCG@k = sum 1/log2(r + 2) over hits in the top k,
        divided by the same sum over the first min(k, targets) ranks.
    """
    keep = n_targets > 0
    hits, n_targets = hits[keep].double(), n_targets[keep].double()
    discount = 1.0 / torch.log2(torch.arange(hits.shape[1], dtype=torch.float64) + 2)
    out = {}
    for k in RECALL_KS:
        out[f"recall@{k}"] = float((hits[:, :k].sum(1) / n_targets.clamp(max=k)).mean())
    for k in NDCG_KS:
        dcg = (hits[:, :k] * discount[:k]).sum(1)
        ideal = torch.cumsum(discount[:k], 0)[(n_targets.clamp(max=k) - 1).long()]
        out[f"ndcg@{k}"] = float((dcg / ideal).mean())
    out["users"] = int(keep.sum())
    return out


@torch.no_grad()
def evaluate_fold(
    score_fn: ScoreFn, fold: FoldIn, vocab_size: int, device: str | torch.device = "cpu"
) -> dict[str, float]:
    """Ranks every item for each held-out user from the fed items, fed and special items excluded.

    On ``device``, a batch of users at a time (memory bounded by a batch of users x catalogue scores).
    """
    top = min(max(*RECALL_KS, *NDCG_KS), vocab_size)
    fed = SequenceTensors.from_sequences(fold.fed, device)
    targets = SequenceTensors.from_sequences(fold.targets, device)
    specials = torch.tensor([PAD_INDEX, vocab_size - 1], device=device)  # padding and the reserved N + 1
    hits, step = [], eval_batch_size(vocab_size, device)
    bad = torch.zeros((), dtype=torch.int64, device=device)
    for start in range(0, fold.fed.num_users, step):
        users = torch.arange(start, min(start + step, fold.fed.num_users), device=device)
        stop = start + len(users)
        tokens = fed.windows(users, fed.lengths[users], widest(fold.fed.lengths, start, stop))
        scores = score_fn(tokens).float()  # (B, V)
        nonfinite = ~torch.isfinite(scores)  # NaN or either infinity, among the rankable items only
        bad += nonfinite.scatter_(1, tokens, False).index_fill_(1, specials, False).any(1).sum()
        scores = scores.scatter(1, tokens, -torch.inf).index_fill(1, specials, -torch.inf)
        wanted = targets.windows(users, targets.lengths[users], widest(fold.targets.lengths, start, stop))
        ranked = scores_ties_against(scores, wanted).topk(top, dim=1).indices  # (B, top)
        hits.append(row_contains(wanted, ranked) & (ranked != PAD_INDEX))
    if int(bad):
        raise EvaluationError(
            f"{int(bad)} of {fold.fed.num_users} held-out users got a NaN or infinite score for a rankable item"
        )
    if not hits:
        return heldout_metrics(torch.zeros(0, top), torch.zeros(0, dtype=torch.int64))
    return heldout_metrics(torch.cat(hits).cpu(), torch.as_tensor(fold.targets.lengths))


def scores_ties_against(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The scores in float64 with each target's lowered to the next float64 below it: every item that ties
    with a target in float32 then ranks before it, and no other score comes between (float32 values are
    far coarser than float64 steps), so a top-k counts ties against the targets.

    Args: scores: (B, V) float32; targets: (B, T) item indices, padding allowed (its score is -inf).
    """
    wide = scores.double()
    below = torch.nextafter(wide.gather(1, targets), torch.tensor(-math.inf, dtype=torch.float64, device=wide.device))
    return wide.scatter_(1, targets, below)


def popularity_fn(train: Sequences, vocab_size: int, device: str | torch.device = "cpu") -> ScoreFn:
    """Scores every user with the training users' item counts: the baseline to beat."""
    return popularity_score_fn(np.bincount(train.items, minlength=vocab_size), device)


class BagEpochs(IterableDataset):
    """An epoch is every training user once, shuffled, as sparse bags of item indices (no (users x catalogue)
    array anywhere): a batch's positions are computed on the host with numpy, its items gathered on
    ``device``. The ranks share one order and each takes its share of a batch."""

    def __init__(
        self,
        train: Sequences,
        batch_size: int,
        seed: int,
        device: str | torch.device = "cpu",
        rank: int = 0,
        world: int = 1,
    ):
        self.seq, self.tensors = train, SequenceTensors.from_sequences(train, device)
        self.batch_size, self.seed, self.device = batch_size, seed, torch.device(device)
        self.rank, self.world, self.epoch = rank, world, 0

    def __len__(self) -> int:
        return int(-(-self.seq.num_users // self.batch_size))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.seq.num_users)
        for start in range(0, len(order), self.batch_size):
            users = order[start : start + self.batch_size][self.rank :: self.world]
            yield self.bag(users)

    def bag(self, users: np.ndarray) -> Bag:
        """The users' items, flat, with each item's row in the batch."""
        lengths = self.seq.lengths[users]
        rows = np.repeat(np.arange(len(users)), lengths)
        within = np.arange(len(rows)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        positions = torch.as_tensor(np.repeat(self.seq.offsets[users], lengths) + within).to(self.device)
        return Bag(self.tensors.items[positions], torch.as_tensor(rows).to(self.device), len(users))


def evaluate_heldout_run(run_dir, data_dir, device: str = "cpu") -> dict:
    """Test metrics of a Mult-VAE run and of popularity, on the test users of the run's own split.

    The split is drawn again from the share and seed the run recorded (``run.json``).
    """
    import time
    from pathlib import Path

    from recserve.constants import RUN_FILE
    from recserve.data.datasets import load_prepared
    from recserve.models.run_loader import load_run
    from recserve.train.run_writer import trained_on

    data = load_prepared(data_dir)
    model = load_run(run_dir).to(device)
    if model.cfg.num_items != data.vocab.num_items:
        raise DataError(
            f"{data_dir}: {data.vocab.num_items} items, but the run {run_dir} was trained on "
            f"{model.cfg.num_items}; evaluate on the data folder it was trained on"
        )
    record = trained_on(run_dir, data, data_dir)
    settings = (record or {}).get("train", {})
    missing = [key for key in ("heldout_share", "seed") if key not in settings]
    if missing:
        raise DataError(
            f"{Path(run_dir) / RUN_FILE}: {' and '.join(missing)} not recorded, so the run's test users cannot be "
            "drawn again; train the run again with this version of recserve"
        )
    split = split_heldout(data.bags, settings["heldout_share"], seed=settings["seed"])
    vocab_size = model.cfg.vocab_size
    started = time.perf_counter()
    test = evaluate_fold(model, split.test, vocab_size, device=device)
    elapsed_s = time.perf_counter() - started
    return {
        "test": {"heldout": test},
        "popularity": {
            "heldout": evaluate_fold(
                popularity_fn(split.train, vocab_size, device), split.test, vocab_size, device=device
            )
        },
        "split": {
            "train_users": split.train.num_users,
            "valid_users": split.valid.fed.num_users,
            "test_users": split.test.fed.num_users,
            "fed_share": FED_SHARE,
        },
        "eval": {"device": str(device), "seconds": round(elapsed_s, 3), "protocols": ["heldout"]},
    }
