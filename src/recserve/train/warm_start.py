"""Warm start by item ID: a run trained on an older catalogue carried over to a newer one, never by index.

Each weight whose rows are the vocabulary (the item embeddings, the output bias) is rebuilt for the new
catalogue: an item the old run knew takes its old row (looked up by its ID in the old run's ``item_ids.npy``), a
new item takes the old catalogue's mean row, and padding and the mask token keep theirs, whether or not the
catalogue's size changed. The attributes' table (``--item-attributes``) is carried where its rows mean the same
values in both; every other weight is carried as it is. A run of another model, or of other settings than the
catalogue's size (window, hidden size, layers...), is refused in one line: its weights would not mean the same.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from recserve.artifacts.catalogue import id_type_of, read_catalogue
from recserve.constants import WEIGHTS_FILE
from recserve.errors import ConfigError
from recserve.models.run_loader import load_config, model_name, read_weights

# what a config takes from its data, not from its settings: another value does not refuse the run
DATA_FIELDS = ("num_items", "attribute_columns", "attribute_rows")
ATTRIBUTES_PREFIX, ATTRIBUTES_TABLE, ATTRIBUTES_CODES = "attributes.", "attributes.table.weight", "attributes.codes"
VOCABULARY_ROWS = ("item_emb.weight", "out_bias")  # a row an item: carried by item ID


def carry_by_id(model: torch.nn.Module, model_cfg, name: str, new_ids: np.ndarray, run: Path) -> dict:
    """Loads the weights of ``run`` into ``model`` (a fresh ``name`` model of ``model_cfg``, for the catalogue
    ``new_ids``), item rows looked up by ID. Returns what was carried: the run, and the items carried, new and
    dropped.

    Raises:
        ConfigError: ``run`` is of another model, or of other settings than the catalogue's size.
    """
    run = Path(run)
    theirs = model_name(run)
    if theirs != name:
        raise ConfigError(
            f"--warm-start {run}: a {theirs} run; this trains {name} (warm start carries one model's weights)"
        )
    old_cfg = load_config(run)
    differ = [
        f"{key} {value} there, {getattr(model_cfg, key)} here"
        for key, value in asdict(old_cfg).items()
        if key not in DATA_FIELDS and value != getattr(model_cfg, key)
    ]
    if differ:
        raise ConfigError(f"--warm-start {run}: other settings than this run's ({'; '.join(differ)}); train with those")
    old_ids, state = np.asarray(read_catalogue(run)), read_weights(run / WEIGHTS_FILE)
    if id_type_of(old_ids) != id_type_of(new_ids):
        raise ConfigError(
            f"--warm-start {run}: its catalogue's item IDs are {id_type_of(old_ids)}, this data's "
            f"{id_type_of(new_ids)}; warm start carries items by ID"
        )
    old_row = _old_rows(old_ids, np.asarray(new_ids))  # (new vocab,) the old vocab row of each, -1 for a new item
    own = model.state_dict()
    carried = {
        key: _by_id(value, old_row) if key in VOCABULARY_ROWS else value
        for key, value in state.items()
        if not key.startswith(ATTRIBUTES_PREFIX)
    }
    carried |= _attribute_state(state, own, old_row)
    try:
        model.load_state_dict(carried)
    except RuntimeError as err:
        raise ConfigError(
            f"--warm-start {run}: its weights do not fit this model ({str(err).splitlines()[0]})"
        ) from None
    kept = int((old_row[1:-1] >= 0).sum())
    return {
        "run": str(run.resolve()),
        "items_carried": kept,
        "items_new": len(new_ids) - kept,
        "items_dropped": len(old_ids) - kept,
    }


def _attribute_state(state: dict, own: dict, old_row: np.ndarray) -> dict:
    """The attributes' weights for the new catalogue: their codes and which items were trained are the new
    data's own; the old run's table of attribute rows is carried where every item both catalogues hold has the
    same codes in both (the rows mean the same values), else it trains again from its start."""
    out = {key: value for key, value in own.items() if key.startswith(ATTRIBUTES_PREFIX)}
    old_table, old_codes = state.get(ATTRIBUTES_TABLE), state.get(ATTRIBUTES_CODES)
    if old_table is None or old_codes is None or ATTRIBUTES_TABLE not in out:
        return out
    new_codes = out[ATTRIBUTES_CODES]
    shared = np.flatnonzero(old_row >= 0)
    alike = old_table.shape == out[ATTRIBUTES_TABLE].shape and old_codes.shape[1:] == new_codes.shape[1:]
    if alike and torch.equal(old_codes[torch.from_numpy(old_row[shared])], new_codes[torch.from_numpy(shared)]):
        out[ATTRIBUTES_TABLE] = old_table
    return out


def _old_rows(old_ids: np.ndarray, new_ids: np.ndarray) -> np.ndarray:
    """For each row of the new vocabulary (padding, items, mask token), its row in the old one, or -1."""
    rows = np.full(len(new_ids) + 2, -1, dtype=np.int64)
    rows[0], rows[-1] = 0, len(old_ids) + 1  # padding and the mask token keep theirs
    if len(old_ids):
        where = np.searchsorted(old_ids, new_ids).clip(0, len(old_ids) - 1)
        found = old_ids[where] == new_ids
        rows[1:-1][found] = where[found] + 1
    return rows


def _by_id(old: torch.Tensor, old_row: np.ndarray) -> torch.Tensor:
    """``old``'s rows rearranged for the new vocabulary: each carried item's own, a new item the old items' mean."""
    mean = old[1:-1].float().mean(0).to(old.dtype)
    out = mean.expand(len(old_row), *old.shape[1:]).clone()
    known = torch.from_numpy(np.flatnonzero(old_row >= 0))
    out[known] = old[torch.from_numpy(old_row[old_row >= 0])]
    return out
