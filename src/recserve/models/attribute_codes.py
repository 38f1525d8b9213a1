"""The item table's attributes as rows of one embedding table, for models that learn an item as its ID plus
its attributes (``--item-attributes``): numpy only, so the trainer and the command line share it.

Every attribute becomes one column of codes over the vocabulary (padding, items 1..N, the mask token): a text
value held by at least ``MIN_ITEMS`` items has its own row, as do a flag's true and false, and a number's
quantile bin (``NUMBER_BINS`` of them, from the catalogue's own values); a missing value, a value too rare to
learn from, padding and the mask token take row 0, which stays zero. Codes are offsets into one table, so an
item's attribute vector is one gather and a sum over its columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recserve.artifacts.item_table import ItemAttributes

NUMBER_BINS = 8  # a number's quantile bins: the year of a film, a price band
MIN_ITEMS = 2  # a text value held by fewer items teaches nothing that carries to another item


@dataclass(frozen=True)
class AttributeCodes:
    """codes: (A, V) int64 rows of the shared table (0: none); rows: the table's size, row 0 included;
    names: the attributes, in the columns' order."""

    codes: np.ndarray
    rows: int
    names: tuple[str, ...]


def attribute_codes(attributes: ItemAttributes) -> AttributeCodes:
    """The codes of a catalogue's attributes (``ItemAttributes``, by catalogue row) over its vocabulary."""
    vocab = attributes.rows + 2
    columns, names, offset = [], [], 1
    for attribute in attributes.columns.values():
        local, width = _local_codes(attribute.kind, attribute.values)  # 0: none, else 1..width
        if width == 0:
            continue  # nothing to learn from: every value missing or too rare
        column = np.zeros(vocab, dtype=np.int64)
        column[1:-1] = np.where(local > 0, local + offset - 1, 0)
        columns.append(column)
        names.append(attribute.name)
        offset += width
    codes = np.stack(columns) if columns else np.zeros((0, vocab), dtype=np.int64)
    return AttributeCodes(codes, offset if columns else 0, tuple(names))


def _local_codes(kind: str, values: np.ndarray) -> tuple[np.ndarray, int]:
    """One attribute's codes 1..width by catalogue row (0: none) and its width."""
    if kind == "bool":  # 1 true, 0 false, -1 missing
        return np.where(values == 1, 1, np.where(values == 0, 2, 0)), 2
    if kind == "number":
        present = ~np.isnan(values)
        if not present.any():
            return np.zeros(len(values), dtype=np.int64), 0
        edges = np.unique(np.quantile(values[present], np.linspace(0, 1, NUMBER_BINS + 1)[1:-1]))
        bins = np.searchsorted(edges, np.where(present, values, 0.0), side="right") + 1
        return np.where(present, bins, 0), len(edges) + 1
    # text: codes into its categories, -1 missing; a category of too few items counts as missing
    held = np.bincount(values[values >= 0], minlength=1) if (values >= 0).any() else np.zeros(1, dtype=np.int64)
    kept = np.flatnonzero(held >= MIN_ITEMS)
    local = np.zeros(len(held), dtype=np.int64)
    local[kept] = np.arange(1, len(kept) + 1)
    return np.where(values >= 0, local[values.clip(0)], 0), len(kept)
