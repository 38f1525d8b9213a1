"""The items hidden catalogue-wide, kept in the session store (``recserve items hide``), followed by a served
model: one read of their version a batch, and of what changed only when the version moved (the whole set only
where the changes since the last read cannot be read alone: ``SessionStore.hidden_changes``), so that a hide
the store acknowledged holds for every batch that starts after it."""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from recserve.errors import StoreError
from recserve.serving.predictor import Predictor
from recserve.sessions import store_contract

log = logging.getLogger(__name__)


WHOLE_READ_S = 1.0  # while the store holds no version, the whole set is read at most this often


class HiddenItems:
    def __init__(self, store, predictor: Predictor):
        """``store``: a ``SessionStore`` of the catalogue's ID type; ``predictor``: whose rules it keeps."""
        self.store, self.predictor = store, predictor
        self.version: int | None = None
        self.hidden: np.ndarray | None = None  # (items,) bool: the predictor's hidden items, as last read
        self.entry = ""  # the store's last change that ``hidden`` holds (its stream's entry)
        self.read_at = -math.inf  # when the whole set was read last (time.monotonic)

    def refresh(self) -> str | None:
        """Brings the predictor's hidden items to the store's; returns why it could not (the last ones read
        then stay: an answer goes on without the store, as a session's does from its request's items). Reads
        the changes since the last read where the store still keeps them, and the whole set otherwise: at the
        first read, and where the version went back (a warning), or is not there (a warning where it was),
        the whole set at most every ``WHOLE_READ_S`` while it stays away: a version that cannot be followed
        never means a set that is never read."""
        try:
            version = self.store.hidden_version()
            if version is not None and version == self.version:
                return None
            if version is None and self.hidden is not None:
                if self.version:
                    log.warning(
                        "the hidden items' version %s is gone from the store: the whole set is read", self.version
                    )
                elif time.monotonic() - self.read_at < WHOLE_READ_S:
                    return None
            elif version is not None and self.version is not None and version < self.version:
                log.warning(
                    "the hidden items' version went back (%s -> %s): the whole set is read", self.version, version
                )
            changes = None
            if version is not None and self.hidden is not None and self.version and version > self.version:
                changes = self.store.hidden_changes(self.entry, self.version)
            if changes is None:  # the first read, or the changes since the last one cannot be read alone
                state = self.store.hidden_state()
                hidden = np.zeros(len(self.predictor.vocab_ids), dtype=bool)
                hidden[self._indices(state.items)] = True
                version, entry = state.version, state.entry
                self.read_at = time.monotonic()
            else:
                assert self.hidden is not None
                hidden = self.hidden.copy()
                for hide, items in changes.changes:  # in order: an item hidden, then shown, ends shown
                    hidden[self._indices(items)] = hide
                version, entry = changes.version, changes.entry
        except StoreError as err:
            return str(err)
        self.predictor.rules.hide(hidden)
        self.hidden, self.version, self.entry = hidden, version, entry
        return None

    def _indices(self, items: list[str]) -> np.ndarray:
        """The positions in the predictor's items of those ``items`` its catalogue holds (others hide nothing)."""
        ids = np.asarray(items, dtype=str)
        if not self.predictor.string_ids:  # what no integer catalogue holds hides nothing
            ids = np.array([int(item) for item in items if store_contract.is_integer_id(item)], dtype=np.int64)
        indices = self.predictor.indices(ids) if len(ids) else np.zeros(0, dtype=np.int64)
        return indices[indices > 0] - 1
