"""Leave-one-out evaluation on the model's device: full ranking (seen items excluded, or not), what serving
ranks, and two sampled protocols, batched so that memory is bounded by a batch of (users x catalogue) scores.

A target's rank is the count of rankable items that score at least as high (a tie counts against it, so
every figure is a lower bound). ``full`` excludes the user's whole history but keeps a repeated target
rankable; ``served`` excludes what the serving graph excludes, the window's items, so a target inside the
window cannot be shown (``UNRANKABLE``); ``full_no_exclusion`` excludes nothing. ``sampled`` is the
BERT4Rec paper's protocol: the target against 100 negatives drawn by popularity, never from the user's
history; ``sampled_uniform`` the SASRec paper's: 100 negatives drawn uniformly from the items the user never
interacted with. Each user's negatives come from a stream of its own (a counter-based hash of the seed,
the protocol and the user), so neither a batch size nor a device moves a figure.

Each batch makes one pass over its (users x catalogue) scores for the count of items at or above each
target; the excluded items are subtracted by looking up their own scores, so no (users x catalogue) mask.
A transformer's scores on a GPU are never written at all: Triton kernels count them tile by tile
(``rank_kernels``), and the batches are as wide as the model's forward allows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F

from recserve.constants import PAD_INDEX, WEIGHTS_FILE
from recserve.data.sequences import Sequences
from recserve.errors import DataError, EvaluationError
from recserve.models.transformer import ItemTransformer
from recserve.train.fused import GpuFused
from recserve.train.metrics import ranking_metrics
from recserve.train.rank_kernels import TileScores, available
from recserve.train.tensors import SequenceTensors, first_of_runs, row_contains, widest

log = logging.getLogger(__name__)

ScoreFn = Callable[[torch.Tensor], torch.Tensor]  # (B, L) tokens -> (B, N + 2) scores
SAMPLED_NEGATIVES = 100
PROTOCOLS = ("full", "served", "full_no_exclusion", "sampled", "sampled_uniform")
# users x catalogue scores at a time: 128 MB, 2 GB (float32). On a GPU a batch's work is mostly kernel launches
# below that: 200,000 users x 1M items under every protocol took 14.7 s at 2^27, 6.5 s at 2^29 (one H200)
SCORES_PER_BATCH = {"cpu": 2**25, "cuda": 2**29}
# users a batch where the kernels count (no scores in memory): the model's forward bounds it, about this many
# (users x window x hidden) activations
TILED_ACTIVATIONS = 2**27
UNRANKABLE = 2**62  # the rank of a target that the protocol cannot show (served: it is in the window)
SAMPLED = ("sampled", "sampled_uniform")
STREAMS = {"sampled": 1, "sampled_uniform": 2}  # each protocol's own random stream
CANDIDATES = 512  # a user's first candidate draws; the rare user they leave short is drawn exactly


def eval_batch_size(vocab_size: int, device: str | torch.device = "cpu") -> int:
    """Users a batch, so that a batch holds about ``SCORES_PER_BATCH`` scores (1 to 4,096)."""
    budget = SCORES_PER_BATCH.get(torch.device(device).type, SCORES_PER_BATCH["cpu"])
    return int(np.clip(budget // vocab_size, 1, 4096))


def tiled_batch_size(model: ItemTransformer) -> int:
    """Users a batch where the kernels count: about ``TILED_ACTIVATIONS`` of the forward's (1 to 8,192)."""
    return int(np.clip(TILED_ACTIVATIONS // (model.cfg.window * model.cfg.hidden), 1, 8192))


def counts_tiled(score_fn: ScoreFn, device: torch.device) -> bool:
    """Whether ``score_fn``'s batches are counted by the kernels: a transformer on a GPU with Triton, whose item
    table the kernels' 32-bit offsets reach (fewer than 2^31 values: 8M items of 256)."""
    if not (isinstance(score_fn, ItemTransformer) and GpuFused.enabled and available(device)):
        return False
    return score_fn.cfg.vocab_size * score_fn.cfg.hidden < 2**31


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
        weights = torch.as_tensor(popularity, dtype=torch.float64, device=device) + 1  # +1: all drawable
        specials = torch.tensor([PAD_INDEX, mask_index], device=device)
        self.weights = {
            "sampled": weights.index_fill(0, specials, 0.0),
            "sampled_uniform": torch.ones_like(weights).index_fill(0, specials, 0.0),
        }
        self.cdfs = {name: w.cumsum(0) for name, w in self.weights.items()}
        self.negatives_drawn: dict[str, np.ndarray] = {}  # the last ranking's, per sampled protocol

    @property
    def user_count(self) -> int:
        return len(self.lengths)

    def ranks(
        self, score_fn: ScoreFn, protocols: tuple[str, ...] = PROTOCOLS, users: tuple[int, int] | None = None
    ) -> dict[str, np.ndarray]:
        """0-based rank of each user's target under each protocol: the count of rankable items that score at
        least as high (a tie counts against the target, so a number reported is a lower bound).

        ``users`` (first, stop) ranks only those users: a DDP rank's share of validation. Every protocol
        ranks each user alike whatever the share or the batch. ``negatives_drawn`` then holds, per
        sampled protocol, how many negatives each user got (``SAMPLED_NEGATIVES``, or all the user's
        drawable items where fewer).

        Raises:
            EvaluationError: a score of a rankable item is NaN or infinite, with the count of such users.
        """
        unknown = set(protocols) - set(PROTOCOLS)
        if unknown:
            raise DataError(f"protocols {sorted(unknown)}: expected some of {', '.join(PROTOCOLS)}")
        first, users_total = users or (0, self.user_count)
        out: dict[str, list[torch.Tensor]] = {name: [] for name in protocols}
        drawn: dict[str, list[torch.Tensor]] = {name: [] for name in protocols if name in SAMPLED}
        bad = torch.zeros((), dtype=torch.int64, device=self.device)
        tiled = counts_tiled(score_fn, self.device)
        vocab_size = len(self.cdfs["sampled"])
        step = tiled_batch_size(cast(ItemTransformer, score_fn)) if tiled else eval_batch_size(vocab_size, self.device)
        for start in range(first, users_total, step):
            stop = min(start + step, users_total)
            ranks, counts, bad_rows = self._rank_batch(score_fn, start, stop, protocols, tiled)
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
    def _rank_batch(self, score_fn, start: int, stop: int, protocols, tiled: bool):
        users = torch.arange(start, stop, device=self.device)
        lengths = self.history.lengths[users]
        window = self.history.windows(users, lengths, self.window - 1)  # what the serving graph is fed
        mask = torch.full((len(users), 1), self.mask_index, device=self.device)
        scores = batch_scores(score_fn, torch.cat([window, mask], 1), tiled)
        target = self.targets[users]
        # the one pass over the catalogue: every rankable item but the target itself that scores at least as high
        target_score, above, bad = scores.tally(target, self.mask_index)
        bad_rows = bad.sum()
        out, drawn = {}, {}
        if "full_no_exclusion" in protocols:
            out["full_no_exclusion"] = above
        whole = self.history.windows(users, lengths, widest(self.lengths, start, stop)).sort(1).values
        if "full" in protocols:  # a repeated target stays rankable
            out["full"] = above - _distinct_at_least(scores, whole, target, target_score)
        if "served" in protocols:  # serving never shows an item of the window, the target included
            served = above - _distinct_at_least(scores, window.sort(1).values, target, target_score)
            out["served"] = torch.where((window == target[:, None]).any(1), UNRANKABLE, served)
        for name in SAMPLED:
            if name in protocols:
                negatives, valid = draw_negatives(
                    self.cdfs[name], self.weights[name], whole, target, users, self.seed, STREAMS[name]
                )
                out[name] = ((scores.at(negatives) >= target_score) & valid).sum(1)
                drawn[name] = valid.sum(1)
        return out, drawn, bad_rows


class DenseScores:
    """A batch's scores ``raw + bias`` from a (B, V) matrix before the output layer's bias and the (V,) float32
    bias: counted in one pass (``_tally``), or read at named items (``_scores_at``)."""

    def __init__(self, raw: torch.Tensor, bias: torch.Tensor):
        self.raw, self.bias = raw, bias

    def tally(self, target: torch.Tensor, mask_index: int):
        return _tally(self.raw, self.bias, target, mask_index)

    def at(self, columns: torch.Tensor) -> torch.Tensor:
        return _scores_at(self.raw, self.bias, columns)


def batch_scores(score_fn: ScoreFn, tokens: torch.Tensor, tiled: bool = False) -> DenseScores | TileScores:
    """A batch's scores: a transformer's query against its item table, counted by the kernels where ``tiled``
    (nothing of (B, V) in memory), else its product as a (B, V) matrix with no pass to add the bias; another
    function's scores and a zero bias."""
    if isinstance(score_fn, ItemTransformer):
        query = score_fn.query(tokens)
        if tiled:
            return TileScores(query, score_fn.item_vectors(), score_fn.item_bias())
        return DenseScores(score_fn.tied_output(query, with_bias=False), score_fn.item_bias().float())
    scores = score_fn(tokens)
    return DenseScores(scores, torch.zeros(scores.shape[1], dtype=torch.float32, device=scores.device))


def _tally_plain(raw: torch.Tensor, bias: torch.Tensor, target: torch.Tensor, mask_index: int):
    """One pass over a batch's scores ``raw + bias`` (float32): each target's score (B, 1); how many rankable
    items (any but padding and the mask token) other than the target score at least as high (B,); and
    whether a rankable item scored NaN or +-inf (B,). Fused into one kernel on GPUs."""
    scores = raw.float() + bias  # the same float32 sum as _scores_at's
    target_score = scores.gather(1, target[:, None])
    columns = torch.arange(scores.shape[1], device=scores.device)
    rankable = (columns != PAD_INDEX) & (columns != mask_index)
    above = ((scores >= target_score) & rankable).sum(1) - 1
    bad = (~torch.isfinite(scores) & rankable).any(1)
    return target_score, above, bad


_tally = GpuFused(_tally_plain, "the ranking's count")


def _scores_at(raw: torch.Tensor, bias: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """(B, K) float32 scores ``raw + bias`` of ``columns`` (B, K), summed as ``_tally_plain`` sums them."""
    return raw.gather(1, columns).float() + bias[columns]


def _distinct_at_least(scores, ordered, target, target_score) -> torch.Tensor:
    """(B,) how many distinct items of each row of ``ordered`` (B, W), sorted, other than padding and the
    target, score at least the target's: the excluded items that the catalogue count included."""
    counted = first_of_runs(ordered) & (ordered != PAD_INDEX) & (ordered != target[:, None])
    return ((scores.at(ordered) >= target_score) & counted).sum(1)


def draw_negatives(
    cdf: torch.Tensor,
    weights: torch.Tensor,
    seen: torch.Tensor,
    target: torch.Tensor,
    users: torch.Tensor,
    seed: int,
    stream: int,
    count: int = SAMPLED_NEGATIVES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` items per user drawn without replacement in proportion to ``weights``, never a ``seen``
    item or the target; a user with fewer such items gets all of them.

    Each user's draws with replacement come from its own stream (``user_uniforms``); the first ``count``
    distinct allowed ones are a draw without replacement (each next one follows the weights of the items
    still allowed). A user whose ``CANDIDATES`` draws leave it short is drawn exactly, by the Gumbel
    top-k trick over the catalogue with noise from the same user's stream.

    Args:
        cdf: (V,) cumulative ``weights`` (zero where an item is never drawn); seen: (B, W) sorted items.

    Returns:
        (B, count) item indices and (B, count) True where the slot holds a drawn item.
    """
    uniform = user_uniforms(seed, stream, users, CANDIDATES)  # (B, M)
    candidates = torch.searchsorted(cdf, uniform * cdf[-1], right=True).clamp(max=cdf.numel() - 1)
    order = torch.argsort(candidates, dim=1, stable=True)
    ordered = candidates.gather(1, order)
    first = torch.zeros_like(ordered, dtype=torch.bool).scatter_(1, order, first_of_runs(ordered))  # no redraw
    allowed = first & ~row_contains(seen, candidates, is_sorted=True) & (candidates != target[:, None])
    taken = allowed & (allowed.cumsum(1) <= count)
    slots = torch.argsort((~taken).to(torch.uint8), dim=1, stable=True)[:, :count]  # the taken, in draw order
    negatives, valid = candidates.gather(1, slots), taken.gather(1, slots)
    short = (valid.sum(1) < count).nonzero()[:, 0]
    rows = eval_batch_size(weights.numel(), weights.device)  # each exact draw holds (rows x catalogue) keys
    for part in short.split(rows):
        exact = _gumbel_draw(weights, seen[part], target[part], users[part], seed, stream, count)
        negatives[part], valid[part] = exact
    return negatives, valid


def _gumbel_draw(weights, seen, target, users, seed: int, stream: int, count: int):
    """The exact draw for a few users: the ``count`` largest log(weight) + Gumbel noise over the catalogue."""
    uniform = user_uniforms(seed, stream + 1_000, users, weights.numel()).clamp_(min=1e-300)  # (b, V)
    keys = weights.log()[None, :] - (-uniform.log_()).log_()
    keys.scatter_(1, seen, -math.inf)
    keys[torch.arange(len(users), device=keys.device), target] = -math.inf
    top, negatives = keys.topk(min(count, weights.numel()), dim=1)
    missing = count - top.shape[1]  # a catalogue smaller than count: the slots beyond it stay empty
    top, negatives = F.pad(top, (0, missing), value=-math.inf), F.pad(negatives, (0, missing))
    return negatives, top > -math.inf


_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32), in int64 arithmetic that never overflows."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser: every input bit moves every output bit."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def user_uniforms(seed: int, stream: int, users: torch.Tensor, count: int) -> torch.Tensor:
    """(B, count) float64 uniforms in [0, 1), draw j of user u a function of (seed, stream, u, j) alone.

    A counter-based generator: the same user gets the same numbers in any batch, share or device.
    """
    key = _mix32(torch.tensor((seed * 0x9E3779B9 + stream) & _MASK32, device=users.device))
    key = _mix32(key ^ (users[:, None] & _MASK32))  # (B, 1)
    return _draws(key, torch.arange(count, device=users.device))


def _draws_plain(key: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """(B, count) float64 uniforms of each row's key (B, 1) and each draw's number ``columns`` (count,): some
    sixty integer operations a draw, one kernel on GPUs."""
    key = _mix32(key ^ columns[None, :])  # (B, count)
    high, low = _mix32(key ^ 0x68E31DA4) >> 8, _mix32(key ^ 0x1B56C4E9) >> 8  # 24 bits each
    return (high * 2**24 + low).double() / 2**48


_draws = GpuFused(_draws_plain, "the sampled protocols' draws")


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


def repeated_targets(inputs: Sequences, targets: np.ndarray, window: int) -> dict[str, int]:
    """How many users' targets repeat an earlier item of theirs: anywhere in the history (``full`` keeps them
    rankable) and among the ``window - 1`` most recent items (``served`` cannot show them)."""
    lengths = inputs.lengths
    owner = np.repeat(np.arange(len(lengths)), lengths)  # (total,) the user of each history item
    hit = inputs.items == np.asarray(targets)[owner]
    from_end = inputs.offsets[owner + 1] - np.arange(len(owner)) - 1  # 0: the most recent item
    users_with = lambda hits: int(np.count_nonzero(np.bincount(owner[hits], minlength=len(lengths))))  # noqa: E731
    return {
        "users": len(lengths),
        "earlier_in_history": users_with(hit),
        "in_served_window": users_with(hit & (from_end < window - 1)),
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


def evaluate_run(
    run_dir, data_dir, seed: int = 0, device: str = "cpu", weights: str = WEIGHTS_FILE, validated: str | None = None
) -> dict:
    """Test metrics of a run and of the popularity baseline under every protocol, on the data folder's test
    split (leave-one-out or by time); beside them the same metrics for the targets that no event before the
    test targets holds (cold items, which an ID-trained model has never seen) and for the others apart.

    Each test user's input is their history before the target; popularity counts those inputs. ``weights``:
    the run's weights file to rank with; ``validated``: the weights validation chose, which a refit run keeps
    beside its own, ranked by the same ranker (the same negatives) as ``test_validated``.
    """
    import time

    from recserve.data.datasets import load_prepared
    from recserve.models.attribute_codes import attribute_codes
    from recserve.models.run_loader import load_run
    from recserve.train.new_items import new_item_metrics
    from recserve.train.run_writer import data_check, trained_on

    data = load_prepared(data_dir)
    model = load_run(run_dir, weights).to(device)
    if model.cfg.num_items != data.vocab.num_items:
        raise DataError(
            f"{data_dir}: {data.vocab.num_items} items, but the run {run_dir} was trained on {model.cfg.num_items}; "
            "evaluate on the data folder it was trained on"
        )
    checked = data_check(trained_on(run_dir, data, data_dir), run_dir)
    model.prepare_inference()
    held = data.test()
    inputs, targets = held.inputs, held.targets
    counts = history_counts(inputs, data.vocab.size)
    trained_counts = history_counts(data.refit_train, data.vocab.size)  # the events before the test targets
    cold = trained_counts[targets] == 0  # no earlier event holds the target
    ranker = Ranker(inputs, targets, counts, model.cfg.window, model.cfg.mask_index, device=device, seed=seed)
    started = time.perf_counter()
    ranks = ranker.ranks(model)
    elapsed_s = time.perf_counter() - started
    drawn = negatives_summary(ranker)
    popular = ranker.ranks(popularity_score_fn(counts, device))
    codes = attribute_codes(data.attributes())
    window, mask_index = model.cfg.window, model.cfg.mask_index
    new = new_item_metrics(model, inputs, targets, trained_counts, codes, window, mask_index, device, seed)
    result = {
        "test": {name: ranking_metrics(r) for name, r in ranks.items()},
        "popularity": {name: ranking_metrics(r) for name, r in popular.items()},
        "test_users": int(inputs.num_users),
        "split": data.info.get("split"),
        "cold_targets": {"users": int(cold.sum()), "share": round(float(cold.mean()), 4) if len(cold) else 0.0},
        "test_apart": {"model": metrics_apart(ranks, cold), "popularity": metrics_apart(popular, cold)},
        "new_items": new,
        "repeated_targets": repeated_targets(inputs, targets, model.cfg.window),
        "sampled_negatives": drawn,
        "seed": seed,
        "eval": {"device": str(device), "seconds": round(elapsed_s, 3), "protocols": list(PROTOCOLS)},
        "data_check": checked,
    }
    if validated:
        chosen = load_run(run_dir, validated).to(device)
        chosen.prepare_inference()
        result["test_validated"] = {name: ranking_metrics(r) for name, r in ranker.ranks(chosen).items()}
    return result


def metrics_apart(ranks: dict[str, np.ndarray], cold: np.ndarray) -> dict[str, dict[str, dict[str, float]]]:
    """The metrics of the warm and the cold targets apart (a part with no target is left out)."""
    parts = {"warm": ~cold, "cold": cold}
    return {
        part: {name: ranking_metrics(r[mask]) for name, r in ranks.items()}
        for part, mask in parts.items()
        if mask.any()
    }
