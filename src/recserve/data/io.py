"""Readers that turn every supported interaction log into one polars frame.

Every reader returns the columns ``user_id``, ``item_id``, ``timestamp`` (and ``rating`` where the source
has ratings), in file order, so that interactions with equal timestamps keep the order of the file.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from recserve.errors import DataError
from recserve.option_fields import option

log = logging.getLogger(__name__)

ML100K = "ml-100k"


@dataclass(frozen=True)
class Columns:
    """Column names of a CSV or Parquet log."""

    user: str = option("user_id", "User column of a CSV/Parquet table.", flags=("--user-col",))
    item: str = option("item_id", "Item column of a CSV/Parquet table.", flags=("--item-col",))
    timestamp: str = option("timestamp", "Timestamp column of a CSV/Parquet table.", flags=("--time-col",))
    rating: str | None = option(  # optional; needed only for a rating threshold
        None, "Rating column of a CSV/Parquet table.", flags=("--rating-col",)
    )


def recbole_example_dir(name: str = ML100K) -> Path:
    """The folder of an example dataset that the ``recbole`` wheel ships (without importing recbole)."""
    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            f"source '{name}' needs the copy that the recbole wheel ships: run `pip install --no-deps recbole`"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "dataset_example" / name
    if not folder.is_dir():
        raise DataError(f"the installed recbole has no {folder}; reinstall it with `pip install --no-deps recbole`")
    return folder


def _require_file(path: Path) -> Path:
    if path.is_dir():
        raise DataError(f"{path}: a folder; give the log file itself (CSV, Parquet, or MovieLens ratings.dat/u.data)")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    return path


def _check_columns(frame: pl.DataFrame, path: Path, wanted: dict[str, str | None]) -> None:
    missing = [f"{role} column '{name}'" for role, name in wanted.items() if name and name not in frame.columns]
    if missing:
        flag = {"user": "--user-col", "item": "--item-col", "timestamp": "--time-col", "rating": "--rating-col"}
        flags = ", ".join(flag[role] for role, name in wanted.items() if name and name not in frame.columns)
        raise DataError(
            f"{path}: missing {', '.join(missing)}; the file has columns {frame.columns}: name yours with {flags}"
        )


def _numeric_timestamps(frame: pl.DataFrame, path: Path, column: str = "timestamp") -> pl.DataFrame:
    """Casts the timestamp column to a number, naming the first row that is not one."""
    ts = frame[column]
    if ts.dtype.is_numeric():
        return frame
    cast = ts.cast(pl.Float64, strict=False)
    bad = cast.is_null() & ts.is_not_null()
    if bad.any():
        row = int(bad.arg_max() or 0)
        raise DataError(
            f"{path}: column '{column}' must be numeric (seconds or any increasing number); "
            f"row {row + 1} holds {ts[row]!r}"
        )
    as_int = cast.cast(pl.Int64, strict=False)
    return frame.with_columns((as_int if (as_int.cast(pl.Float64) == cast).all() else cast).alias(column))


def _finish(frame: pl.DataFrame, path: Path) -> pl.DataFrame:
    if frame.height == 0:
        raise DataError(f"{path}: the log holds no interactions")
    nulls = [c for c in ("user_id", "item_id") if frame[c].null_count()]
    if nulls:
        row = int(frame[nulls[0]].is_null().arg_max() or 0)
        raise DataError(f"{path}: column '{nulls[0]}' is empty on row {row + 1}")
    return _numeric_timestamps(frame, path)


def read_ml100k() -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """The ML-100K log shipped in the recbole wheel (atomic files, tab-separated), and its items' titles with
    two attributes that rules can filter on: the release year and the first of the genres."""
    folder = recbole_example_dir(ML100K)
    inter = pl.read_csv(folder / "ml-100k.inter", separator="\t", quote_char=None)
    inter = inter.rename(lambda c: c.split(":")[0])
    frame = inter.select("user_id", "item_id", "timestamp", "rating")
    titles = None
    if (folder / "ml-100k.item").is_file():
        items = pl.read_csv(folder / "ml-100k.item", separator="\t", quote_char=None, infer_schema=False)
        items = items.with_columns(pl.col(items.columns[0]).cast(pl.Int64))
        items = items.rename(lambda c: c.split(":")[0])
        titles = items.select(
            pl.col("item_id"),
            pl.col("movie_title").alias("title"),
            pl.col("release_year").cast(pl.Int64, strict=False).alias("year"),
            pl.col("class").str.split(" ").list.first().alias("genre"),
        )
    return _finish(frame, folder / "ml-100k.inter"), titles


def read_movielens(path: Path) -> pl.DataFrame:
    """MovieLens ``ratings.dat`` (``user::item::rating::timestamp``) or ``u.data`` (tab-separated)."""
    _require_file(path)
    with path.open("rb") as fh:
        first = fh.readline().decode("utf-8", "replace")
    separator = "::" if "::" in first else "\t"
    lines = pl.read_csv(path, has_header=False, separator="\x1f", new_columns=["line"], quote_char=None)
    parts = lines["line"].str.split(separator)
    widths = parts.list.len()
    if (widths != 4).any():
        row = int((widths != 4).arg_max() or 0)
        raise DataError(
            f"{path}: line {row + 1} has {widths[row]} fields; expected user{separator}item{separator}"
            f"rating{separator}timestamp"
        )
    frame = pl.DataFrame(
        {name: parts.list.get(i) for i, name in enumerate(["user_id", "item_id", "rating", "timestamp"])}
    )
    frame = _integers_where_possible(frame, ["user_id", "item_id"])
    rating = frame["rating"].cast(pl.Float64, strict=False)
    if rating.is_null().any():
        row = int(rating.is_null().arg_max() or 0)
        raise DataError(f"{path}: line {row + 1} has rating {frame['rating'][row]!r}; expected a number")
    return _finish(frame.with_columns(rating), path)


def read_table(path: Path, columns: Columns = Columns()) -> pl.DataFrame:
    """A CSV or Parquet log with user, item and timestamp columns (names in ``columns``)."""
    _require_file(path)
    try:
        if path.suffix.lower() in {".parquet", ".pq"}:
            raw = pl.read_parquet(path)
        else:
            raw = pl.read_csv(path, infer_schema_length=10_000)
    except (pl.exceptions.PolarsError, OSError) as err:
        raise DataError(
            f"{path}: cannot be read as {'Parquet' if path.suffix == '.parquet' else 'CSV'}: {err}"
        ) from err
    wanted = {"user": columns.user, "item": columns.item, "timestamp": columns.timestamp, "rating": columns.rating}
    _check_columns(raw, path, wanted)
    select = [
        pl.col(columns.user).alias("user_id"),
        pl.col(columns.item).alias("item_id"),
        pl.col(columns.timestamp).alias("timestamp"),
    ]
    if columns.rating:
        select.append(pl.col(columns.rating).cast(pl.Float64).alias("rating"))
    return _finish(raw.select(select), path)


def read_item_table(path: Path, item_col: str = "item_id") -> pl.DataFrame:
    """The shop's item table (CSV, Parquet or JSON lines): the item ID column (``item_col``, renamed item_id)
    and any attribute columns (category, brand, price, flags), one row an item.

    Raises:
        DataError: an unreadable file, no ID column, or an item ID given twice.
    """
    _require_file(path)
    suffix = path.suffix.lower()
    try:
        if suffix in {".parquet", ".pq"}:
            raw = pl.read_parquet(path)
        elif suffix in {".jsonl", ".ndjson"}:
            raw = pl.read_ndjson(path)
        else:
            raw = pl.read_csv(path, infer_schema_length=10_000)
    except (pl.exceptions.PolarsError, OSError) as err:
        raise DataError(f"{path}: cannot be read as an item table (CSV, Parquet or JSON lines): {err}") from err
    if item_col not in raw.columns:
        raise DataError(
            f"{path}: no item column '{item_col}'; the file has columns {raw.columns}: name yours with --items-id-col"
        )
    table = raw.rename({item_col: "item_id"}) if item_col != "item_id" else raw
    twice = table["item_id"].is_duplicated()
    if twice.any():
        raise DataError(f"{path}: item {table['item_id'][int(twice.arg_max() or 0)]!r} has more than one row")
    return table


def read_text_sequences(path: Path) -> pl.DataFrame:
    """``user item`` lines, each user's lines in time order (the BERT4Rec and SASRec papers' files)."""
    _require_file(path)
    lines = pl.read_csv(path, has_header=False, separator="\x1f", new_columns=["line"], quote_char=None)
    parts = lines["line"].str.strip_chars().str.split(" ")
    widths = parts.list.len()
    if (widths != 2).any():
        row = int((widths != 2).arg_max() or 0)
        raise DataError(f"{path}: line {row + 1} is {lines['line'][row]!r}; expected 'user item'")
    frame = pl.DataFrame({"user_id": parts.list.get(0), "item_id": parts.list.get(1)})
    frame = _integers_where_possible(frame, ["user_id", "item_id"])
    return _finish(frame.with_row_index("timestamp").with_columns(pl.col("timestamp").cast(pl.Int64)), path)


def _integers_where_possible(frame: pl.DataFrame, names: list[str]) -> pl.DataFrame:
    """Keeps integer IDs as Int64 and any other IDs as strings."""
    out = []
    for name in names:
        as_int = frame[name].cast(pl.Int64, strict=False)
        out.append(as_int if as_int.null_count() == frame[name].null_count() else frame[name])
    return frame.with_columns(out)


BUILT_IN = (ML100K,)  # the sources recserve reads by name


def _not_a_source(source: str) -> str:
    """What to say of a bare name that is neither a file here nor a source recserve ships."""
    import difflib

    close = difflib.get_close_matches(source.lower(), BUILT_IN, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else "; or give a file (CSV, Parquet, ratings.dat, u.data, .txt)"
    return f"{source}: no such file, and no source recserve ships by that name (built in: {', '.join(BUILT_IN)}){hint}"


def read_source(source: str, columns: Columns = Columns()) -> tuple[pl.DataFrame, pl.DataFrame | None, str]:
    """Reads SOURCE: ``ml-100k``, a MovieLens file, a CSV/Parquet table or a text file of ``user item`` lines.

    Returns:
        The log, item titles (or None) and the kind of source read.
    """
    if source == ML100K:
        frame, titles = read_ml100k()
        return frame, titles, ML100K
    path = Path(source)
    name = path.name.lower()
    if not path.exists() and path.parent == Path(".") and not path.suffix:
        raise DataError(_not_a_source(source))
    if name in {"ratings.dat", "u.data"}:
        return read_movielens(path), None, "movielens"
    if path.suffix.lower() in {".csv", ".parquet", ".pq"}:
        return read_table(path, columns), None, "table"
    if path.suffix.lower() in {".txt", ".seq", ""}:
        return read_text_sequences(path), None, "text"
    raise DataError(
        f"{source}: unknown source; expected 'ml-100k', ratings.dat, u.data, a .csv/.parquet table "
        "or a .txt file of 'user item' lines"
    )
