"""The item vocabulary: index 0 is padding, items 1..N in sorted ID order, N + 1 is the mask token."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recserve.constants import PAD_INDEX

LUT_MAX_ENTRIES = 1 << 24  # dense ID tables up to 128 MiB of int64


def use_lookup_table(item_ids: np.ndarray) -> bool:
    """Dense non-negative integer IDs map through a direct table (one gather, exports to every backend)."""
    return (
        item_ids.dtype.kind in "iu"
        and len(item_ids) > 0
        and item_ids[0] >= 0
        and item_ids[-1] < max(LUT_MAX_ENTRIES, 16 * len(item_ids))
    )


def lookup_table(item_ids: np.ndarray) -> np.ndarray:
    """(max ID + 2,) index of each ID, 0 where an ID is not in the vocabulary.

    The last entry, one past the largest ID, is 0 too: a lookup clipped to the table's end answers
    "unknown" for every larger ID.
    """
    lut = np.zeros(int(item_ids[-1]) + 2, dtype=np.int64)
    lut[item_ids] = np.arange(1, len(item_ids) + 1)
    return lut


@dataclass(frozen=True)
class Vocab:
    """Sorted item IDs; the item with ``ids[i]`` has index ``i + 1``.

    Attributes:
        ids: sorted unique item IDs, int64 or str (numpy array).
    """

    ids: np.ndarray

    @property
    def num_items(self) -> int:
        return len(self.ids)

    @property
    def mask_index(self) -> int:
        return len(self.ids) + 1

    @property
    def size(self) -> int:
        """Embedding rows: padding, the items and the mask token."""
        return len(self.ids) + 2

    @property
    def is_string(self) -> bool:
        return self.ids.dtype.kind in "OUS"

    def lookup(self, item_ids: np.ndarray) -> np.ndarray:
        """Maps IDs to indices with one vectorised search; unknown IDs map to padding (0)."""
        item_ids = as_str_ids(item_ids) if self.is_string else np.asarray(item_ids)
        if item_ids.size == 0 or self.num_items == 0:
            return np.zeros(item_ids.shape, dtype=np.int64)
        pos = np.searchsorted(self.ids, item_ids)
        pos_clipped = np.minimum(pos, self.num_items - 1)
        found = self.ids[pos_clipped] == item_ids
        return np.where(found, pos_clipped + 1, PAD_INDEX).astype(np.int64)

    def to_ids(self, indices: np.ndarray) -> np.ndarray:
        """Maps item indices (1..N) back to IDs."""
        return self.ids[np.asarray(indices) - 1]


def build_vocab(item_ids: np.ndarray) -> Vocab:
    """Builds the vocabulary from every item ID seen (duplicates allowed), sorted for determinism."""
    ids = np.unique(np.asarray(item_ids))
    if ids.dtype.kind in "OUS":
        ids = ids.astype(str)
    return Vocab(ids=ids)


def as_bytes_ids(item_ids: np.ndarray) -> np.ndarray:
    """Item IDs as Triton's BYTES tensors hold them: an object array of UTF-8 bytes; integer IDs unchanged."""
    item_ids = np.asarray(item_ids)
    if item_ids.dtype.kind in "iu":
        return item_ids
    return np.char.encode(as_str_ids(item_ids), "utf-8").astype(np.object_)


def as_str_ids(item_ids) -> np.ndarray:
    """String IDs as a numpy str array, decoding UTF-8 bytes (what Triton's BYTES tensors hold)."""
    item_ids = np.asarray(item_ids)
    if item_ids.dtype.kind == "S" or item_ids.dtype == object:
        flat = [x.decode() if isinstance(x, bytes) else str(x) for x in item_ids.reshape(-1)]
        return np.array(flat, dtype=str).reshape(item_ids.shape)
    return item_ids.astype(str)
