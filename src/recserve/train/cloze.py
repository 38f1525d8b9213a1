"""Cloze training samples for BERT4Rec, built one whole batch at a time with numpy (no per-row Python)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import IterableDataset

from recserve.constants import PAD_INDEX
from recserve.data.sequences import Sequences


@dataclass(frozen=True)
class ClozeSettings:
    window: int  # tokens per sample
    mask_index: int  # the mask token
    mask_prob: float  # each real item is masked with this probability
    last_item_rate: float  # share of samples that mask only the last item, as at serving time


def cloze_batch(seq: Sequences, users: np.ndarray, rng: np.random.Generator, s: ClozeSettings):
    """One batch: random windows of the users' sequences, masked.

    Returns:
        tokens (B, L) with masked positions set to the mask token, and labels (B, L) holding the original
        item at masked positions and padding (0) everywhere else. Padding is never masked.
    """
    lengths = seq.lengths[users]
    # the window ends anywhere from the first full window to the end of the sequence
    lowest_end = np.minimum(lengths, s.window)
    ends = lowest_end + (rng.random(len(users)) * (lengths - lowest_end + 1)).astype(np.int64)
    items = seq.windows(users, ends, s.window)  # (B, L), left-padded
    real = items != PAD_INDEX
    masked = (rng.random(items.shape) < s.mask_prob) & real
    last_only = rng.random(len(users)) < s.last_item_rate
    masked[last_only] = False
    masked[:, -1] |= last_only
    masked[~masked.any(1), -1] = True  # every sample predicts at least its last item
    tokens = np.where(masked, s.mask_index, items)
    labels = np.where(masked, items, PAD_INDEX)
    return torch.as_tensor(tokens), torch.as_tensor(labels)


class ClozeBatches(IterableDataset):
    """An epoch is every user once per ``samples_per_user``, shuffled, split across DDP ranks."""

    def __init__(self, seq: Sequences, settings: ClozeSettings, batch_size: int, samples_per_user: int, seed: int):
        self.seq, self.settings, self.batch_size = seq, settings, batch_size
        self.samples_per_user, self.seed = samples_per_user, seed
        self.epoch = 0
        self.rank, self.world = 0, 1

    def __len__(self) -> int:
        return -(-(self._users().size // self.world) // self.batch_size)

    def _users(self) -> np.ndarray:
        users = np.flatnonzero(self.seq.lengths > 0)
        return np.tile(users, self.samples_per_user)

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch, self.rank])
        self.epoch += 1
        users = rng.permutation(self._users())
        users = users[: len(users) - len(users) % self.world][self.rank :: self.world]  # equal steps per rank
        for start in range(0, len(users), self.batch_size):
            yield cloze_batch(self.seq, users[start : start + self.batch_size], rng, self.settings)
