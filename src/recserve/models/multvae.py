"""Mult-VAE: a variational autoencoder over a user's bag of items with a multinomial likelihood.

Liang, Krishnan, Hoffman and Jebara, "Variational Autoencoders for Collaborative Filtering", WWW 2018.
The input is the L2-normalised multi-hot of a user's items, with dropout; the encoder gives a Gaussian
posterior over a latent vector, the decoder a softmax over the catalogue; the KL term is annealed from 0
up to a cap. The index space is BERT4Rec's (0 padding, items 1..N, N + 1 reserved), so both models share
the serving graph; the special columns are never fed in and never recommended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from recserve.constants import PAD_INDEX
from recserve.models.model_configs import MultVAEConfig


@dataclass
class Bag:
    """Training users' item sets, sparse: every (row, item) pair once.

    Attributes:
        items: (nnz,) item indices; rows: (nnz,) each item's row in the batch; users: the batch's rows.
    """

    items: torch.Tensor
    rows: torch.Tensor
    users: int


class MultVAE(nn.Module):
    """Encoder to a diagonal Gaussian, decoder to catalogue logits."""

    item_columns: torch.Tensor

    def __init__(self, cfg: MultVAEConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.encoder = nn.Sequential(
            nn.Linear(cfg.vocab_size, cfg.hidden), nn.Tanh(), nn.Linear(cfg.hidden, 2 * cfg.latent)
        )
        self.decoder = nn.Sequential(
            nn.Linear(cfg.latent, cfg.hidden), nn.Tanh(), nn.Linear(cfg.hidden, cfg.vocab_size)
        )
        self.drop = nn.Dropout(cfg.dropout)
        special = torch.ones(cfg.vocab_size)
        special[[PAD_INDEX, cfg.mask_index]] = 0
        self.register_buffer("item_columns", special, persistent=False)
        for layer in (*self.encoder, *self.decoder):
            if isinstance(layer, nn.Linear):  # the paper's Xavier weights, small normal biases
                nn.init.xavier_normal_(layer.weight)
                nn.init.normal_(layer.bias, std=0.001)

    def multi_hot(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, L) item indices (padding and the reserved index allowed). Returns (B, V) in {0, 1}."""
        ones = torch.ones_like(tokens, dtype=self.item_columns.dtype)
        # zeros on the columns' device without naming it (a traced graph would keep a named device)
        hot = torch.zeros_like(self.item_columns, dtype=ones.dtype)[None, :].repeat(tokens.shape[0], 1)
        return hot.scatter(1, tokens, ones) * self.item_columns

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, V) multi-hot. Returns the posterior's mean and log-variance, each (B, latent)."""
        h = self.drop(F.normalize(x, dim=1))
        mu, logvar = self.encoder(h).chunk(2, dim=1)
        return mu, logvar

    def prepare_inference(self) -> None:
        """Nothing to precompute: the encoder is two dense layers (the same interface as BERT4Rec's)."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, L) a history of item indices, in any order. Returns scores (B, V) from the posterior mean."""
        mu, _ = self.encode(self.multi_hot(tokens))  # in the buffers' dtype: follows .to(bf16), not int8
        return self.decoder(mu)

    def encode_bag(self, bag: Bag) -> tuple[torch.Tensor, torch.Tensor]:
        """``encode`` of the bag's multi-hot rows without building them: the first layer gathers the columns
        of the bag's items, weighted by the normalisation and the input dropout. Returns (B, latent) twice."""
        first, rest = cast(nn.Linear, self.encoder[0]), self.encoder[1:]
        ones = torch.ones_like(bag.items, dtype=first.weight.dtype)
        count = torch.zeros(bag.users, dtype=ones.dtype, device=ones.device).index_add_(0, bag.rows, ones)
        weight = self.drop(count.rsqrt()[bag.rows])  # (nnz,) 1 / sqrt(items in the row), with dropout
        columns = first.weight.T[bag.items] * weight[:, None]  # (nnz, hidden)
        hidden = torch.zeros(bag.users, first.out_features, dtype=columns.dtype, device=columns.device)
        mu, logvar = rest(hidden.index_add(0, bag.rows, columns) + first.bias).chunk(2, dim=1)
        return mu, logvar

    def loss(self, bag: Bag, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Negative ELBO with the KL term weighted by ``beta``, from a sparse bag of items.

        Returns:
            The loss and the multinomial negative log-likelihood alone (both scalars, means over rows).
        """
        mu, logvar = self.encode_bag(bag)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if self.training else mu
        log_probs = F.log_softmax(self.decoder(z).float(), dim=1)  # (B, V), on the device only
        nll = -log_probs[bag.rows, bag.items].sum() / bag.users
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).float().sum(1).mean()
        return nll + beta * kl, nll

    def beta(self, step: int) -> float:
        """The annealed KL weight at an optimizer step: step / anneal_steps, at most the cap."""
        return min(self.cfg.anneal_cap, step / self.cfg.anneal_steps)
