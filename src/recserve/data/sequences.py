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
        return self.heads(self.lengths - drop_last)

    def heads(self, counts: np.ndarray) -> Sequences:
        """The same users with only their first ``counts[u]`` items (a (users,) array)."""
        position = np.arange(len(self.items)) - np.repeat(self.offsets[:-1], self.lengths)
        return self.where(position < np.repeat(counts, self.lengths))

    def at(self, positions: np.ndarray) -> np.ndarray:
        """(users,) each user's item at ``positions[u]`` (0 = first); every position within its sequence."""
        return self.items[self.offsets[:-1] + positions]

    def select(self, users: np.ndarray) -> Sequences:
        """The given users' sequences, in the given order."""
        lengths = self.lengths[users]
        starts = np.repeat(self.offsets[users], lengths)
        within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return Sequences(items=self.items[starts + within], offsets=offsets)

    def where(self, keep: np.ndarray) -> Sequences:
        """The same users with only the items where ``keep`` (a (total,) bool array) is True."""
        owner = np.repeat(np.arange(self.num_users), self.lengths)
        counts = np.bincount(owner[keep], minlength=self.num_users)
        return Sequences(items=self.items[keep], offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))

    def unique_items(self) -> Sequences:
        """Each user's items without repeats (first occurrences, in order)."""
        owner = np.repeat(np.arange(self.num_users), self.lengths)
        _, first = np.unique(owner * (int(self.items.max(initial=0)) + 1) + self.items, return_index=True)
        keep = np.zeros(len(self.items), dtype=bool)
        keep[first] = True
        return self.where(keep)

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
