"""Per-user chronological sequences and the leave-one-out split (last item test, second to last validation)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recserve.constants import PAD_INDEX


@dataclass(frozen=True)
class Sequences:
    """Every user's item indices in time order, stored flat.

    Attributes:
        items: (total,) int64 item indices of all users, user after user.
        offsets: (users + 1,) start of each user's items in ``items``.
    """

    items: np.ndarray
    offsets: np.ndarray

    @property
    def num_users(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def truncated(self, drop_last: int) -> Sequences:
        """The same users with their last ``drop_last`` items removed (train: 2, validation input: 1)."""
        lengths = np.maximum(self.lengths - drop_last, 0)
        keep = np.repeat(np.arange(self.num_users), lengths)
        starts = np.repeat(self.offsets[:-1], lengths)
        within = np.arange(len(keep)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return Sequences(items=self.items[starts + within], offsets=offsets)

    def last(self, position_from_end: int) -> np.ndarray:
        """(users,) the item at ``-position_from_end`` for each user (1 = last)."""
        return self.items[self.offsets[1:] - position_from_end]

    def windows(self, users: np.ndarray, ends: np.ndarray, length: int) -> np.ndarray:
        """Left-padded windows ending (exclusive) at ``ends`` within each user's sequence.

        Args:
            users: (B,) user rows.
            ends: (B,) end positions within each user's sequence, 0 <= end <= len.
            length: window length L.

        Returns:
            (B, L) int64 indices, padding (0) on the left where the history is shorter than L.
        """
        starts = self.offsets[users] + ends  # absolute position one past the last item
        cols = np.arange(-length, 0)
        pos = starts[:, None] + cols[None, :]  # (B, L)
        valid = cols[None, :] >= -ends[:, None]
        return np.where(valid, self.items[np.clip(pos, 0, max(len(self.items) - 1, 0))], PAD_INDEX)


def sequences_from_frame(frame) -> Sequences:
    """Builds flat sequences from a polars frame with an ``items`` list column (one row per user)."""
    lengths = frame["items"].list.len().to_numpy().astype(np.int64)
    items = frame["items"].explode().to_numpy().astype(np.int64) if frame.height else np.zeros(0, np.int64)
    return Sequences(items=items, offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
