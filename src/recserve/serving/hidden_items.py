"""The items hidden catalogue-wide, kept in the session store (``recserve items hide``), followed by a served
model: one read of their version a batch, and of the set only when the version moved, so that a hide the
store acknowledged holds for every batch that starts after it."""

from __future__ import annotations

import logging

import numpy as np

from recserve.errors import StoreError
from recserve.serving.predictor import Predictor
from recserve.sessions import store_contract

log = logging.getLogger(__name__)


class HiddenItems:
    def __init__(self, store, predictor: Predictor):
        """``store``: a ``SessionStore`` of the catalogue's ID type; ``predictor``: whose rules it keeps."""
        self.store, self.predictor = store, predictor
        self.version: int | None = None

    def refresh(self) -> str | None:
        """Brings the predictor's hidden items to the store's; returns why it could not (the last ones read
        then stay: an answer goes on without the store, as a session's does from its request's items)."""
        try:
            version = self.store.hidden_version()
            if version == self.version:
                return None
            version, items = self.store.hidden()
        except StoreError as err:
            return str(err)
        hidden = np.zeros(len(self.predictor.vocab_ids), dtype=bool)
        ids = np.asarray(items, dtype=str)
        if not self.predictor.string_ids:  # what no integer catalogue holds hides nothing
            ids = np.array([int(item) for item in items if store_contract.is_integer_id(item)], dtype=np.int64)
        indices = self.predictor.indices(ids) if len(ids) else np.zeros(0, dtype=np.int64)
        hidden[indices[indices > 0] - 1] = True
        self.predictor.rules.hide(hidden)
        self.version = version
        return None
