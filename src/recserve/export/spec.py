"""What an export is built from (numpy only: the serving path reads it without torch)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GraphSpec:
    """What an export is built from."""

    vocab_ids: np.ndarray  # (N,) sorted IDs, int64 or str
    popularity: np.ndarray  # (N + 2,)
    window: int
    model: str  # bert4rec, sasrec or multvae
    id_mapping: str  # "graph": the graph maps IDs; "predictor": the predictor maps them and the graph sees 1..N
