"""Losses over the catalogue: the exact softmax where it fits, a sampled softmax with log-Q correction beyond.

Sampled softmax: each batch shares one pool of negatives, the batch's own targets (in-batch negatives,
which follow popularity) plus ``negatives`` items drawn uniformly or by popularity; each negative's logit
is corrected by the log of the item's expected count in the pool (log-Q: Bengio & Senecal 2008; Yi et
al., RecSys 2019), which makes the pool's sum of exponentials an unbiased estimate of the catalogue's, so
the sampled loss tends to the full one as the pool grows (tests check this). Its log-sum-exp runs in
blocks of positions (``POOL_CHUNK_ELEMENTS`` scores at most), compiled on GPUs. Seen-item exclusion leaves
a sample's own items out of each softmax by index (a scatter of the window's items for the exact softmax;
for the pool, a (rows x pool) table of the first column that holds each pool item), never through a
dense (positions x catalogue) mask. docs/training.md says what each loss costs.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from recserve.constants import PAD_INDEX
from recserve.errors import ConfigError
from recserve.train import pool_kernels
from recserve.train.fused import GpuFused
from recserve.train.train_config import LossSettings


class CatalogueLoss:
    """Per-position cross-entropy of queries against the item table (the model's tied output layer)."""

    def __init__(
        self,
        settings: LossSettings,
        popularity: np.ndarray,
        mask_index: int,
        device: str | torch.device = "cpu",
        left_out: np.ndarray | None = None,
    ):
        """Args: popularity: (V,) training counts by index (padding and mask included, and ignored);
        left_out: (V,) bool, items no softmax holds (never drawn, never scored), or None."""
        if settings.name == "auto":
            raise ConfigError("CatalogueLoss needs a resolved loss; call LossSettings.resolve first")
        problems = settings.validate()  # again once resolved: auto may have become a sampled loss
        if problems:
            raise ConfigError("bad loss settings: " + "; ".join(problems))
        self.settings, self.mask_index = settings, mask_index
        counts = torch.as_tensor(popularity, dtype=torch.float64, device=device) + 1.0  # +1: every item drawable
        counts[[PAD_INDEX, mask_index]] = 0
        # what no exact softmax holds, made here: a step captured as a CUDA graph copies nothing from the host
        self.special = torch.tensor([PAD_INDEX, mask_index], device=device)
        if left_out is not None and left_out.any():
            rows = torch.as_tensor(np.flatnonzero(left_out), device=device)
            counts[rows] = 0
            self.special = torch.cat([self.special, rows])
        self.p_popular = (counts / counts.sum()).float()  # (V,) what in-batch targets follow
        weights = counts if settings.name == "sampled-popularity" else (counts > 0).double()
        # the draws' cumulative weights, summed once on the host in float64: CUDA's multinomial sums them anew
        # on every call in an order that varies, so that a seeded generator did not repeat its draws
        cumulative = weights.cpu().cumsum(0)
        if settings.name != "full" and not cumulative[-1] > 0:
            raise ConfigError(f"the {settings.name} loss has no item to draw: every item is left out")
        self.p_draw = (weights / cumulative[-1].clamp(min=1.0).item()).float()
        self.cdf, self.cdf_total = cumulative.to(device), float(cumulative[-1])
        self.last_drawable = int(torch.searchsorted(cumulative, cumulative[-1]))  # the last item of weight > 0

    def __call__(
        self,
        query: torch.Tensor,
        table: torch.Tensor,
        bias: torch.Tensor,
        targets: torch.Tensor,
        exclude: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
        negatives: torch.Tensor | None = None,
        upto: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-position losses, 0 where the target is padding (an unused slot).

        Args:
            query: (C, H) output-side vectors at the positions; table: (V, H) item vectors; bias: (V,).
            targets: (C,) item to predict.
            exclude: items left out of each position's softmax (the target stays; padding allowed): (B, R)
                per sample with ``rows``, the (C,) sample row of each position, or (C, R) per position
                without; None leaves nothing out.
            negatives: a sampled loss's draws for this call (``draw``); None draws them here.
            upto: (C,) with ``rows``: position c leaves out only ``exclude[rows[c], : upto[c] + 1]`` (SASRec:
                what the user has seen by then); None: the whole row.

        Returns:
            (C,) float32 cross-entropy.
        """
        if exclude is not None and rows is None:  # per position: each position its own row
            rows = torch.arange(len(targets), device=targets.device)
        if self.settings.name != "full":
            drawn = self.draw() if negatives is None else negatives
            return self._sampled(query, table, bias, targets, exclude, rows, upto, drawn)
        if exclude is not None:  # (C, R): the scatter below needs it per position
            exclude = exclude[rows]
            if upto is not None:
                later = torch.arange(exclude.shape[1], device=exclude.device) > upto[:, None]
                exclude = exclude.masked_fill(later, PAD_INDEX)
        return self._full(query, table, bias, targets, exclude)

    def _full(self, query, table, bias, targets, exclude) -> torch.Tensor:
        special = self.special
        if exclude is not None:  # (C, R): every listed item but the target (padding is out already)
            exclude = exclude.masked_fill(exclude == targets[:, None], PAD_INDEX)
        return _ExcludedCrossEntropy.apply(query, table, bias, targets, special, exclude, self.settings.smoothing)

    def draw(self, generator: torch.Generator | None = None) -> torch.Tensor | None:
        """A sampled loss's negatives for one call, (negatives,) item indices; None for the exact softmax.

        Drawn before the step's compiled function, not in it: torch.compile cannot take a generator, and
        would split the step's graph where one is used."""
        if self.settings.name == "full":
            return None
        # by the inverse of the cumulative weights: each uniform lands on the item whose share of [0, total)
        # holds it, so an item of weight 0 (padding, the mask token, a left-out item) is never drawn
        uniform = torch.rand(self.settings.negatives, dtype=torch.float64, device=self.cdf.device, generator=generator)
        # a product that rounds up to the total itself (odds 2^-53) would land past the end
        return torch.searchsorted(self.cdf, uniform * self.cdf_total, right=True).clamp_(max=self.last_drawable)

    def _sampled(self, query, table, bias, targets, exclude, rows, upto, drawn) -> torch.Tensor:
        in_batch = targets[: self.settings.negatives]
        pool = torch.cat([in_batch, drawn])  # (S,)
        # each pool item's expected count in the pool, gathered for the pool alone (not for the catalogue)
        expected = in_batch.numel() * self.p_popular[pool] + self.settings.negatives * self.p_draw[pool]  # (S,)
        special = (pool == PAD_INDEX) | (pool == self.mask_index)
        # one gather for targets and pool: each gather's gradient is a dense (V, H) table at catalogue scale
        gathered, split = torch.cat([targets, pool]), [targets.numel(), pool.numel()]
        target_vectors, pool_vectors = F.embedding(gathered, table).split(split)
        target_bias, pool_bias = bias[gathered].split(split)
        pool_bias = (pool_bias.float() - expected.clamp(min=1e-30).log()).masked_fill(special, -math.inf)
        positive = ((query * target_vectors).sum(-1) + target_bias).float()  # (C,)
        if exclude is None:
            seen = torch.full((1, pool.numel()), NEVER, dtype=torch.int16, device=pool.device)
            rows, limit = torch.zeros_like(targets), torch.zeros_like(targets)
        else:
            seen = first_columns(exclude, pool)  # (B, S)
            limit = upto if upto is not None else torch.full_like(targets, exclude.shape[1] - 1)
        others = pool_logsumexp(query, pool_vectors, pool_bias, pool, targets, seen, rows, limit)  # (C,)
        loss = torch.logaddexp(positive, others) - positive
        return torch.where(targets != PAD_INDEX, loss, 0.0)


NEVER = torch.iinfo(torch.int16).max  # first_columns' "not in this row"
POOL_CHUNK_ELEMENTS = 2**26  # the sampled loss's largest (positions x pool) block: 64M scores, 128 MB in bf16


def first_columns(items: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """(B, S) int16: the first column of ``items`` (B, R) that holds ``pool[s]``, or ``NEVER``.

    Padding is never found. Built from the pool sorted (a sorted search of each of the B x R items, then a
    scatter into the slot of each item's first copy there), so no (B, R, S) comparison and nothing of the
    catalogue's size. Every shape is known before the step runs: no ``unique``, whose count of distinct items
    a GPU would have to send to the host, each step waiting for it.
    """
    if items.shape[1] >= NEVER:
        raise ConfigError(f"window={items.shape[1]}: the sampled losses take windows below {NEVER}")
    ordered = pool.sort().values  # (S,): an item's copies side by side, its first copy where the search lands
    items = items.contiguous()
    slot = torch.searchsorted(ordered, items).clamp(max=ordered.numel() - 1)  # (B, R)
    found = (ordered[slot] == items) & (items != PAD_INDEX)
    cols = torch.arange(items.shape[1], device=items.device).expand_as(items)
    first = torch.full((items.shape[0], ordered.numel()), NEVER, dtype=torch.int16, device=items.device)
    first.scatter_reduce_(1, slot, torch.where(found, cols, NEVER).to(torch.int16), "amin")
    return first[:, torch.searchsorted(ordered, pool)]


def pool_logsumexp(query, vectors, bias, pool, targets, seen, rows, limit) -> torch.Tensor:
    """(C,) float32 log-sum-exp of each position's pool logits ``query @ vectors.T + bias``, leaving out the
    pool items that position has seen (``seen[rows[c], s] <= limit[c]``) and its own target.

    Under a 16-bit autocast on a GPU with Triton, by ``pool_kernels`` (no logit in memory); elsewhere in
    blocks of positions, forward and backward (which recomputes each block's logits), so that no (positions
    x pool) tensor exceeds ``POOL_CHUNK_ELEMENTS``. A position with nothing left gets -inf (its loss is then 0).
    """
    dtype = torch.get_autocast_dtype(query.device.type) if torch.is_autocast_enabled(query.device.type) else None
    limit = limit.to(seen.dtype)
    if dtype is not None and pool_kernels.usable(query, dtype):  # no (positions x pool) logit in memory
        return pool_kernels.pool_logsumexp(query, vectors, bias, pool, targets, seen, rows, limit, dtype)
    return _PoolLogSumExp.apply(query, vectors, bias, pool, targets, seen, rows, limit, dtype)


def _block_logits(query, vectors, bias, pool, targets, seen, rows, limit) -> torch.Tensor:
    """One block's pool logits, float32, with the left-out items at -inf: (c, S)."""
    logits = torch.addmm(bias.to(query.dtype), query, vectors.T).float()
    drop = (seen[rows] <= limit[:, None]) | (pool[None, :] == targets[:, None])
    return logits.masked_fill(drop, -math.inf)


def _block_forward(query, vectors, bias, pool, targets, seen, rows, limit) -> torch.Tensor:
    return torch.logsumexp(_block_logits(query, vectors, bias, pool, targets, seen, rows, limit), 1)


def _block_weights(query, vectors, bias, pool, targets, seen, rows, limit, lse, grad) -> torch.Tensor:
    """d loss / d logits of one block: the softmax over the kept pool items times the upstream gradient."""
    logits = _block_logits(query, vectors, bias, pool, targets, seen, rows, limit)
    scale = torch.where(torch.isfinite(lse), grad, 0.0)[:, None]
    return ((logits - lse.clamp(min=-1e30)[:, None]).exp() * scale).to(query.dtype)


# on GPUs each block's mask, widening and log-sum-exp fused by torch.compile (one pass over the logits where
# eager PyTorch makes several); plain on CPUs, while GpuFused.enabled is False, or where compiling fails
_fused_forward = GpuFused(_block_forward, "the sampled loss", dynamic=False)
_fused_weights = GpuFused(_block_weights, "the sampled loss", dynamic=False)


class _PoolLogSumExp(torch.autograd.Function):
    """``pool_logsumexp``'s blocks, with its gradients for the queries, the pool vectors and the bias."""

    @staticmethod
    def forward(ctx, query, vectors, bias, pool, targets, seen, rows, limit, dtype):
        q, v = (query, vectors) if dtype is None else (query.to(dtype), vectors.to(dtype))
        step = max(1, POOL_CHUNK_ELEMENTS // max(pool.numel(), 1))
        lse = torch.cat(
            [
                _fused_forward(
                    q[i : i + step], v, bias, pool, targets[i : i + step], seen, rows[i : i + step], limit[i : i + step]
                )
                for i in range(0, len(targets), step)
            ]
        )
        ctx.save_for_backward(q, v, bias, pool, targets, seen, rows, limit, lse)
        ctx.dtypes, ctx.step = (query.dtype, vectors.dtype, bias.dtype), step
        return lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        q, v, bias, pool, targets, seen, rows, limit, lse = ctx.saved_tensors
        grad_q = torch.empty_like(q)
        grad_v = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
        for i in range(0, len(targets), ctx.step):
            block = slice(i, i + ctx.step)
            w = _fused_weights(
                q[block],
                v,
                bias,
                pool,
                targets[block],
                seen,
                rows[block],
                limit[block],
                lse[block],
                grad[block].float(),
            )  # (c, S)
            grad_q[block] = w @ v
            grad_v += (w.T @ q[block]).float()
            grad_bias += w.sum(0, dtype=torch.float32)
        query_dtype, vectors_dtype, bias_dtype = ctx.dtypes
        return (
            grad_q.to(query_dtype),
            grad_v.to(vectors_dtype),
            grad_bias.to(bias_dtype),
            None,
            None,
            None,
            None,
            None,
            None,
        )


class _ExcludedCrossEntropy(torch.autograd.Function):
    """The exact softmax cross-entropy over the catalogue with some items left out of each row, in one
    (C, V) buffer: the logits become their exponentials in place and the backward pass reads them (softmax
    minus the target's one-hot), where addmm, index_fill, scatter and log_softmax under autograd each kept a
    copy (tests compare the losses and gradients with a plain softmax).

    With label smoothing e the target's one-hot becomes (1 - e) one-hot + e spread evenly over the row's
    rankable items (those not left out, the target among them): the loss is logsumexp - (1 - e) x target's
    logit - e x the rankable logits' mean.
    """

    @staticmethod
    def forward(ctx, query, table, bias, targets, special, exclude, smoothing=0.0):
        logits = torch.addmm(bias, query, table.T).float()  # (C, V); under autocast a bf16 product, widened
        logits.index_fill_(1, special, -math.inf)
        if exclude is not None:
            logits.scatter_(1, exclude, -math.inf)
        real = targets != PAD_INDEX
        target_logit = logits.gather(1, targets[:, None]).squeeze(1)  # (C,)
        if smoothing:  # the rankable logits' count and mean, before the buffer turns into exponentials
            rankable = logits.isfinite()
            count = rankable.sum(1, dtype=torch.float32)  # (C,)
            mean = torch.where(rankable, logits, 0.0).sum(1) / count.clamp(min=1.0)
            target_logit = (1.0 - smoothing) * target_logit + smoothing * mean
            del rankable
        top = logits.amax(1, keepdim=True)  # (C, 1); logsumexp's own temporaries cost as much as all this
        total = logits.sub_(top).exp_().sum(1, keepdim=True)  # the logits' buffer: exp(logit - top)
        loss = torch.where(real, (top + total.log()).squeeze(1) - target_logit, 0.0)
        ctx.save_for_backward(query, table, logits, total, targets, real, special, exclude)  # softmax = logits / total
        ctx.bias_dtype, ctx.smoothing = bias.dtype, smoothing
        ctx.count = count if smoothing else None
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        query, table, exps, total, targets, real, special, exclude = ctx.saved_tensors
        scale = torch.where(real, grad_loss.float(), 0.0)  # (C,): padding slots give no gradient
        grad_logits = exps.mul_(scale[:, None] / total)  # (C, V) softmax x upstream, in place: needed once
        if ctx.smoothing:  # minus the spread share on every rankable item; left-out items stay at 0
            grad_logits.sub_((ctx.smoothing * scale / ctx.count.clamp(min=1.0))[:, None])
            grad_logits.index_fill_(1, special, 0.0)
            if exclude is not None:
                grad_logits.scatter_(1, exclude, 0.0)
        grad_logits.scatter_add_(1, targets[:, None], -(1.0 - ctx.smoothing) * scale[:, None])
        grad_query = (grad_logits @ table.float()).to(query.dtype) if ctx.needs_input_grad[0] else None
        grad_table = (grad_logits.T @ query.float()).to(table.dtype) if ctx.needs_input_grad[1] else None
        grad_bias = grad_logits.sum(0).to(ctx.bias_dtype) if ctx.needs_input_grad[2] else None
        return grad_query, grad_table, grad_bias, None, None, None, None
