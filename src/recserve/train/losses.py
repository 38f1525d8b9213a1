"""Losses over the catalogue: the exact softmax where it fits, a sampled softmax with log-Q correction beyond.

Sampled softmax: each batch shares one pool of negatives, the batch's own targets (in-batch negatives,
which follow popularity) plus ``negatives`` items drawn uniformly or by popularity; each negative's logit
is corrected by the log of the item's expected count in the pool (log-Q: Bengio & Senecal 2008; Yi et
al., RecSys 2019), which makes the pool's sum of exponentials an unbiased estimate of the catalogue's, so
the sampled loss tends to the full one as the pool grows (tests check this). Seen-item exclusion leaves
a sample's own items out of each softmax by index (a scatter of the window's items, a sorted search for
the pool), never through a dense (positions x catalogue) mask.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from recserve.constants import PAD_INDEX
from recserve.errors import ConfigError
from recserve.train.config import LossSettings
from recserve.train.tensors import row_contains


class CatalogueLoss:
    """Per-position cross-entropy of queries against the item table (the model's tied output layer)."""

    def __init__(
        self, settings: LossSettings, popularity: np.ndarray, mask_index: int, device: str | torch.device = "cpu"
    ):
        """Args: popularity: (V,) training counts by index (padding and mask included, and ignored)."""
        if settings.name == "auto":
            raise ConfigError("CatalogueLoss needs a resolved loss; call LossSettings.resolve first")
        self.settings, self.mask_index = settings, mask_index
        counts = torch.as_tensor(popularity, dtype=torch.float64, device=device) + 1.0  # +1: every item drawable
        counts[[PAD_INDEX, mask_index]] = 0
        self.p_popular = (counts / counts.sum()).float()  # (V,) what in-batch targets follow
        uniform = (counts > 0).float()
        self.p_draw = self.p_popular if settings.name == "sampled-popularity" else uniform / uniform.sum()

    def __call__(
        self,
        query: torch.Tensor,
        table: torch.Tensor,
        bias: torch.Tensor,
        targets: torch.Tensor,
        exclude: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Per-position losses, 0 where the target is padding (an unused slot).

        Args:
            query: (C, H) output-side vectors at the positions; table: (V, H) item vectors; bias: (V,).
            targets: (C,) item to predict.
            exclude: items left out of each position's softmax (the target stays; padding allowed): (B, R)
                per sample with ``rows``, the (C,) sample row of each position, or (C, R) per position
                without; None leaves nothing out.

        Returns:
            (C,) float32 cross-entropy.
        """
        if self.settings.name != "full":
            return self._sampled(query, table, bias, targets, exclude, rows, generator)
        if exclude is not None and rows is not None:
            exclude = exclude[rows]  # (C, R): the scatter below needs it per position
        return self._full(query, table, bias, targets, exclude)

    def _full(self, query, table, bias, targets, exclude) -> torch.Tensor:
        special = torch.tensor([PAD_INDEX, self.mask_index], device=query.device)
        if exclude is not None:  # (C, R): every listed item but the target (padding is out already)
            exclude = exclude.masked_fill(exclude == targets[:, None], PAD_INDEX)
        return _ExcludedCrossEntropy.apply(query, table, bias, targets, special, exclude)

    def _sampled(self, query, table, bias, targets, exclude, rows, generator) -> torch.Tensor:
        drawn = torch.multinomial(self.p_draw, self.settings.negatives, replacement=True, generator=generator)
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
        negative = torch.addmm(pool_bias.to(query.dtype), query, pool_vectors.T)  # (C, S)
        drop = pool[None, :] == targets[:, None]  # (C, S) accidental hits: the positive is scored once
        if exclude is not None:  # per sample, then spread to its positions; or per position
            drop |= row_contains(exclude, pool)[rows] if rows is not None else row_contains(exclude, pool)
        others = torch.logsumexp(negative.masked_fill(drop, -math.inf).float(), 1)
        loss = torch.logaddexp(positive, others) - positive
        return torch.where(targets != PAD_INDEX, loss, 0.0)


class _ExcludedCrossEntropy(torch.autograd.Function):
    """The exact softmax cross-entropy over the catalogue with some items left out of each row, in one
    (C, V) buffer: the logits become their exponentials in place and the backward pass reads them (softmax
    minus the target's one-hot), where addmm, index_fill, scatter and log_softmax under autograd each kept a
    copy (tests compare the losses and gradients with a plain softmax)."""

    @staticmethod
    def forward(ctx, query, table, bias, targets, special, exclude):
        logits = torch.addmm(bias, query, table.T).float()  # (C, V); under autocast a bf16 product, widened
        logits.index_fill_(1, special, -math.inf)
        if exclude is not None:
            logits.scatter_(1, exclude, -math.inf)
        real = targets != PAD_INDEX
        target_logit = logits.gather(1, targets[:, None]).squeeze(1)  # (C,)
        top = logits.amax(1, keepdim=True)  # (C, 1); logsumexp's own temporaries cost as much as all this
        total = logits.sub_(top).exp_().sum(1, keepdim=True)  # the logits' buffer: exp(logit - top)
        loss = torch.where(real, (top + total.log()).squeeze(1) - target_logit, 0.0)
        ctx.save_for_backward(query, table, logits, total, targets, real)  # softmax = logits / total
        ctx.bias_dtype = bias.dtype
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        query, table, exps, total, targets, real = ctx.saved_tensors
        scale = torch.where(real, grad_loss.float(), 0.0)  # (C,): padding slots give no gradient
        grad_logits = exps.mul_(scale[:, None] / total)  # (C, V) softmax x upstream, in place: needed once
        grad_logits.scatter_add_(1, targets[:, None], -scale[:, None])
        grad_query = (grad_logits @ table.float()).to(query.dtype) if ctx.needs_input_grad[0] else None
        grad_table = (grad_logits.T @ query.float()).to(table.dtype) if ctx.needs_input_grad[1] else None
        grad_bias = grad_logits.sum(0).to(ctx.bias_dtype) if ctx.needs_input_grad[2] else None
        return grad_query, grad_table, grad_bias, None, None, None
