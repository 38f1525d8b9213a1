"""Tensor helpers that training batches, evaluation and the losses share: histories as two flat tensors on
a device, the widest history of a batch, and which items each row holds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from recserve.constants import PAD_INDEX
from recserve.data.sequences import Sequences


@dataclass(frozen=True)
class SequenceTensors:
    """Every user's item indices in time order, flat, on one device (``Sequences``' layout).

    Attributes:
        items: (total,) int64 item indices, user after user.
        offsets: (users + 1,) int64 start of each user's items.
    """

    items: torch.Tensor
    offsets: torch.Tensor

    @classmethod
    def from_sequences(cls, seq: Sequences, device: str | torch.device = "cpu") -> SequenceTensors:
        items = torch.as_tensor(seq.items, dtype=torch.int64).to(device)
        return cls(items, torch.as_tensor(seq.offsets, dtype=torch.int64).to(device))

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    def windows(self, users: torch.Tensor, ends: torch.Tensor, length: int) -> torch.Tensor:
        """Left-padded windows ending (exclusive) at ``ends`` within each user's sequence.

        Args:
            users: (B,) user rows; ends: (B,) end positions, 0 <= end <= the user's length.

        Returns:
            (B, L) int64 indices, padding (0) on the left where the history is shorter than L.
        """
        cols = torch.arange(-length, 0, device=users.device)  # (L,)
        pos = (self.offsets[users] + ends)[:, None] + cols  # (B, L) absolute positions
        valid = cols >= -ends[:, None]
        picked = self.items[pos.clamp(0, max(self.items.numel() - 1, 0))]
        return torch.where(valid, picked, PAD_INDEX)


def first_of_runs(ordered: torch.Tensor) -> torch.Tensor:
    """(B, W) True at the first of each run of equal items in the sorted rows of ``ordered``."""
    return ordered != F.pad(ordered[:, :-1], (1, 0), value=-1)


def widest(lengths: np.ndarray, start: int, stop: int) -> int:
    """The longest of ``lengths[start:stop]`` (at least 1): the window that holds a batch's whole histories."""
    return max(int(lengths[start:stop].max(initial=0)), 1)


def row_contains(items: torch.Tensor, queries: torch.Tensor, is_sorted: bool = False) -> torch.Tensor:
    """(B, Q) True where ``queries[b, q]`` is among ``items[b]`` (B, R), by a sorted search per row.

    ``queries`` may also be (Q,), shared by every row; ``is_sorted``: the rows of ``items`` are sorted already.
    """
    ordered = items if is_sorted else items.sort(1).values  # (B, R)
    queries = queries.expand(items.shape[0], -1).contiguous()
    found = torch.searchsorted(ordered, queries).clamp(max=max(items.shape[1] - 1, 0))
    return ordered.gather(1, found) == queries
