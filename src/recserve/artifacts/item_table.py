"""The item table that travels between stages (``items.parquet``): one row an item of the catalogue, in its
order (row i is the item of vocabulary index i + 1), with its ID, its interaction count, its title where the
source has one, and the shop's attributes (category, brand, price, flags) where ``recserve data --items``
was given a table of them. Written by ``recserve data``, copied into every run and export, and read here
only: ``read_attributes`` gives the attributes as typed numpy columns, which business rules compile into
masks over the catalogue (``recserve.rules``).
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from recserve.constants import ITEMS_FILE
from recserve.errors import DataError

if TYPE_CHECKING:
    import polars as pl

ATTRIBUTES_FILE = "item_attributes.npz"  # in an export: the item table's attributes, numpy only
# the item table's own columns; every other column is an attribute
RESERVED = ("index", "item_id", "count", "title")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # an attribute is named in rules: an identifier
KINDS = ("string", "number", "bool")


@dataclass(frozen=True)
class Attribute:
    """One attribute as rules read it, by catalogue row: ``string`` (``codes`` into ``categories``, -1
    where missing), ``number`` (``values`` float64, NaN where missing) or ``bool`` (``values`` int8: 1, 0,
    -1 where missing)."""

    name: str
    kind: str
    values: np.ndarray
    categories: np.ndarray | None = None  # string: the sorted distinct values

    @property
    def missing(self) -> np.ndarray:
        if self.kind == "number":
            return np.isnan(self.values)
        return self.values < 0


@dataclass(frozen=True)
class ItemAttributes:
    """Every attribute of a catalogue of ``rows`` items, by name (empty where the data had none)."""

    rows: int
    columns: dict[str, Attribute]

    def describe(self) -> str:
        """``name (kind), ...``: what a rule may refer to."""
        return ", ".join(f"{a.name} ({a.kind})" for a in self.columns.values()) or "none"


def attribute_problem(name: str, dtype: pl.DataType) -> str | None:
    """Why a column of the shop's item table cannot be an attribute, or None where it can."""
    import polars as pl

    if name in RESERVED:
        return f"'{name}' is the item table's own column; rename the attribute"
    if not NAME.match(name) or keyword.iskeyword(name) or name in ("true", "false"):
        return f"'{name}' is not a name a rule can use: letters, digits and _, not starting with a digit"
    if dtype == pl.Null:
        return f"'{name}' holds no value at all; give it values or leave the column out"
    if _kind(dtype) is None:
        return f"'{name}' is of type {dtype}; attributes are text, numbers or booleans"
    return None


def _kind(dtype: pl.DataType) -> str | None:
    import polars as pl

    if dtype == pl.String or isinstance(dtype, pl.Categorical | pl.Enum):
        return "string"
    if dtype == pl.Boolean:
        return "bool"
    if dtype.is_numeric():
        return "number"
    return None


def attributes_of(items: pl.DataFrame) -> ItemAttributes:
    """The attributes of an item table (every column but ``RESERVED``), as rules read them.

    Raises:
        DataError: a column that cannot be an attribute (``attribute_problem``).
    """
    import polars as pl

    columns = {}
    for name in items.columns:
        if name in RESERVED:
            continue
        problem = attribute_problem(name, items[name].dtype)
        if problem:
            raise DataError(f"{ITEMS_FILE}: {problem}")
        column = items[name]
        kind = _kind(column.dtype)
        if kind == "string":
            text = column.cast(pl.String)
            categories = np.asarray(text.drop_nulls().unique().sort().to_list(), dtype=str)
            codes = np.searchsorted(categories, text.fill_null("").to_numpy().astype(str))
            codes = np.where(text.is_null().to_numpy(), -1, codes).astype(np.int32)
            columns[name] = Attribute(name, kind, codes, categories)
        elif kind == "bool":
            values = column.cast(pl.Int8).fill_null(-1).to_numpy().astype(np.int8)
            columns[name] = Attribute(name, kind, values)
        else:
            values = column.cast(pl.Float64).fill_null(float("nan")).to_numpy().astype(np.float64)
            columns[name] = Attribute(name, "number", values)
    return ItemAttributes(items.height, columns)


def read_attributes(folder: Path, rows: int) -> ItemAttributes:
    """The attributes of a folder's catalogue of ``rows`` items: an export's ``item_attributes.npz`` (numpy
    only: what a served model reads), else the item table of a prepared data or run folder; none where the
    folder holds neither (one written before the item table travelled with the catalogue).

    Raises:
        DataError: attributes of another length, or a column no rule can use.
    """
    folder = Path(folder)
    if (folder / ATTRIBUTES_FILE).is_file():
        attributes = _load(folder / ATTRIBUTES_FILE)
    elif (folder / ITEMS_FILE).is_file():
        import polars as pl

        attributes = attributes_of(pl.read_parquet(folder / ITEMS_FILE))
    else:
        return ItemAttributes(rows, {})
    if attributes.rows != rows:
        raise DataError(f"{folder}: attributes of {attributes.rows} items for a catalogue of {rows}; export again")
    return attributes


def write_attributes(folder: Path, attributes: ItemAttributes) -> None:
    """The attributes as an export keeps them (``item_attributes.npz``), for serving without polars."""
    arrays: dict[str, np.ndarray] = {"rows": np.array(attributes.rows)}
    for n, attribute in enumerate(attributes.columns.values()):
        arrays[f"{n}.name"] = np.array(attribute.name)
        arrays[f"{n}.kind"] = np.array(attribute.kind)
        arrays[f"{n}.values"] = attribute.values
        if attribute.categories is not None:
            arrays[f"{n}.categories"] = attribute.categories
    np.savez(Path(folder) / ATTRIBUTES_FILE, **arrays)


def _load(path: Path) -> ItemAttributes:
    with np.load(path, allow_pickle=False) as saved:
        columns = {}
        for n in range(sum(1 for key in saved.files if key.endswith(".name"))):
            name = str(saved[f"{n}.name"])
            categories = saved[f"{n}.categories"] if f"{n}.categories" in saved.files else None
            columns[name] = Attribute(name, str(saved[f"{n}.kind"]), saved[f"{n}.values"], categories)
        return ItemAttributes(int(saved["rows"]), columns)
