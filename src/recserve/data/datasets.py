"""``recserve data``: prepares an interaction log, and loads what it wrote."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from recserve.artifacts.catalogue import id_type_of
from recserve.artifacts.item_table import ItemAttributes, attributes_of, read_attributes
from recserve.constants import DATA_FORMAT_VERSION, DATASET_FILE, ITEMS_FILE, SEQUENCES_FILE
from recserve.data.io import Columns, read_item_table, read_source
from recserve.data.sequences import Sequences, sequences_from_frame
from recserve.data.splits import LEAVE_ONE_OUT, TIME, Cuts, HeldOut, SplitSettings, time_cuts
from recserve.data.vocab import Vocab, build_vocab
from recserve.errors import ConfigError, DataError
from recserve.files import replaced_on_success

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrepareOptions:
    """How a log becomes sequences."""

    min_user_interactions: int = 5  # users with fewer are dropped (at least 3: train, validation, test)
    min_item_interactions: int = 1  # items with fewer are dropped
    rating_threshold: float | None = None  # keep ratings >= this (implicit feedback); None keeps all
    dedup: bool = False  # keep only the first interaction of each (user, item) pair
    columns: Columns = field(default_factory=Columns)
    items: str | None = None  # the shop's item table (attributes by item ID), kept in items.parquet
    items_id_col: str | None = None  # the item table's ID column (None: the log's, ``columns.item``)
    unseen_items: bool = False  # the item table's items that no event names join the catalogue
    split: SplitSettings = field(default_factory=SplitSettings)

    def validate(self) -> None:
        problems = []
        problems += self.split.problems()
        if self.min_user_interactions < 3:
            problems.append(
                f"min_user_interactions={self.min_user_interactions}: must be at least 3 "
                "(one train, one validation and one test item)"
            )
        if self.unseen_items and self.items is None:
            problems.append("unseen_items needs an item table (--items) to take them from")
        if self.min_item_interactions < 1:
            problems.append(f"min_item_interactions={self.min_item_interactions}: must be at least 1")
        if problems:
            raise ConfigError("; ".join(problems))


@dataclass(frozen=True)
class PreparedData:
    """A prepared data folder, loaded."""

    vocab: Vocab
    user_ids: np.ndarray
    sequences: Sequences
    popularity: np.ndarray  # (N + 2,) interaction counts by item index; 0 for padding and mask
    titles: np.ndarray | None  # (N,) titles by item index - 1, where the source has them
    info: dict
    cuts: Cuts  # where each user's validation and test targets lie (leave-one-out or by time)

    @property
    def train(self) -> Sequences:
        """The items a model learns from while it is validated."""
        return self.cuts.train(self.sequences)

    @property
    def refit_train(self) -> Sequences:
        """Every item before the test targets (``train --refit``)."""
        return self.cuts.train(self.sequences, refit=True)

    @property
    def bags(self) -> Sequences:
        return self.cuts.bags(self.sequences)

    def valid(self) -> HeldOut:
        return self.cuts.valid(self.sequences)

    def test(self) -> HeldOut:
        return self.cuts.test(self.sequences)

    def attributes(self) -> ItemAttributes:
        """The item table's attributes, by catalogue row (none where the data had no item table)."""
        return read_attributes(Path(self.info["folder"]), self.vocab.num_items)


def _filter(frame: pl.DataFrame, options: PrepareOptions) -> pl.DataFrame:
    if options.rating_threshold is not None:
        if "rating" not in frame.columns:
            raise DataError("a rating threshold needs a rating column; this source has none")
        frame = frame.filter(pl.col("rating") >= options.rating_threshold)
    if options.dedup:
        frame = frame.unique(subset=["user_id", "item_id"], keep="first", maintain_order=True)
    # Both thresholds at once, repeated until stable (a k-core), so neither breaks the other.
    while True:
        before = frame.height
        frame = frame.filter(pl.len().over("item_id") >= options.min_item_interactions)
        frame = frame.filter(pl.len().over("user_id") >= options.min_user_interactions)
        if frame.height == before:
            return frame


def prepare(source: str, out: Path, options: PrepareOptions = PrepareOptions()) -> dict:
    """Reads SOURCE, writes the prepared folder OUT atomically and returns its summary (``dataset.json``)."""
    options.validate()
    frame, titles, kind = read_source(source, options.columns)
    if options.split.kind == TIME and kind == "text":
        raise DataError(f"{source}: 'user item' lines carry no timestamps; a time split needs a log with them")
    raw_rows = frame.height
    frame = _filter(frame.with_row_index("_row"), options)
    if frame.height == 0:
        raise DataError(
            f"{source}: no interactions left after filtering (min_user_interactions="
            f"{options.min_user_interactions}, min_item_interactions={options.min_item_interactions}, "
            f"rating_threshold={options.rating_threshold})"
        )
    listed = (
        _unseen_ids(frame, options) if options.unseen_items else np.zeros(0, dtype=frame["item_id"].to_numpy().dtype)
    )
    vocab = build_vocab(np.concatenate([frame["item_id"].to_numpy(), listed]))
    frame = frame.sort(["user_id", "timestamp", "_row"])  # ties in time keep file order
    frame = frame.with_columns(pl.Series("index", vocab.lookup(frame["item_id"].to_numpy())))
    if options.split.kind == TIME:
        users, known, split = _split_by_time(frame, options)
    else:
        users = frame.group_by("user_id", maintain_order=True).agg(pl.col("index").alias("items"))
        users = users.with_columns(
            pl.col("items").list.get(-2).alias("valid_item"), pl.col("items").list.get(-1).alias("test_item")
        )
        known, split = frame, {"kind": LEAVE_ONE_OUT}
    counts = np.bincount(known["index"].to_numpy(), minlength=vocab.size).astype(np.int64)
    items = pl.DataFrame({"index": np.arange(1, vocab.num_items + 1), "item_id": vocab.ids, "count": counts[1:-1]})
    if titles is not None:
        titles = titles.with_columns(pl.col("item_id").cast(items["item_id"].dtype, strict=False))
        items = items.join(titles.unique("item_id", keep="first"), on="item_id", how="left", maintain_order="left")
    described: dict = {}
    if options.items is not None:
        items, described = _with_attributes(items, Path(options.items), options.items_id_col or options.columns.item)
    kinds = {name: column.kind for name, column in attributes_of(items).columns.items()}
    info = {
        "format_version": DATA_FORMAT_VERSION,
        "source": source,
        "source_kind": kind,
        "users": users.height,
        "items": vocab.num_items,
        "interactions": frame.height,
        "raw_interactions": raw_rows,
        "item_id_type": id_type_of(vocab.ids),  # decided here, once; every later stage reads it
        "user_id_type": "string" if users["user_id"].dtype == pl.String else "int64",
        "split": split,
        "options": {k: v for k, v in asdict(options).items() if k != "columns"} | {"columns": asdict(options.columns)},
        "attributes": {"kinds": kinds} | described,
    }
    _write_atomically(out, {ITEMS_FILE: items, SEQUENCES_FILE: users}, info)
    return info


def _split_by_time(frame: pl.DataFrame, options: PrepareOptions) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    """Each user's items up to their first event after the test cut, with how many lie before each cut; the
    events a model may know at the test cut (for the popularity counts); what the split holds.

    Raises:
        DataError: no user with a test target that has an item before it.
    """
    test_after = options.split.test_after
    assert test_after is not None  # validate() holds it
    test_cut, valid_cut = time_cuts(frame["timestamp"].to_numpy(), test_after, options.split.valid_after)
    ts = pl.col("timestamp")
    users = frame.group_by("user_id", maintain_order=True).agg(
        pl.col("index").alias("items"),
        (ts <= valid_cut).sum().cast(pl.Int64).alias("before_valid"),
        (ts <= test_cut).sum().cast(pl.Int64).alias("before_test"),
    )
    only_after = users.filter(pl.col("before_test") == 0).height  # no history before the test cut
    users = users.filter(pl.col("before_test") > 0).with_columns(
        pl.col("items").list.head(pl.col("before_test") + 1)  # nothing past the first test event is used
    )
    lengths = users["items"].list.len()
    valid_users = int(((users["before_valid"] < users["before_test"]) & (users["before_valid"] > 0)).sum())
    test_users = int((lengths > users["before_test"]).sum())
    if test_users == 0:
        raise DataError(
            f"--test-after {test_after}: no user has an event after the cut ({test_cut:g}) and one before it"
        )
    split = {
        "kind": TIME,
        "test_after": test_cut,
        "valid_after": valid_cut,
        "test_users": test_users,
        "valid_users": valid_users,
        "users_only_after_test_cut": only_after,
        "target": "each user's first event after the cut, every earlier event the history",
    }
    return users, frame.filter(ts <= test_cut), split


def _unseen_ids(frame: pl.DataFrame, options: PrepareOptions) -> np.ndarray:
    """The item table's IDs (of the log's ID type; others match no item) that the filtered log does not name."""
    assert options.items is not None  # validate() holds it
    table = read_item_table(Path(options.items), options.items_id_col or options.columns.item)
    ids = table["item_id"].cast(frame["item_id"].dtype, strict=False).drop_nulls()
    return ids.filter(~ids.is_in(frame["item_id"].implode())).unique().to_numpy()


def _with_attributes(items: pl.DataFrame, path: Path, item_col: str) -> tuple[pl.DataFrame, dict]:
    """The item table with the shop's attributes joined on (missing where the shop's table lacks an item),
    and what was joined: the items matched and the rows that matched none.

    Raises:
        DataError: an unreadable table (a column no rule could use is refused by ``attributes_of`` after).
    """
    table = read_item_table(path, item_col)
    cast = table["item_id"].cast(items["item_id"].dtype, strict=False)
    table = table.with_columns(cast).filter(cast.is_not_null())  # IDs of another type match no item
    if "title" in table.columns and "title" in items.columns:
        items = items.drop("title")  # the shop's titles replace the log's
    joined = items.join(table, on="item_id", how="left", maintain_order="left")
    matched = int(items["item_id"].is_in(table["item_id"].implode()).sum())
    summary = {"file": str(path), "items_described": matched, "rows_for_no_catalogue_item": table.height - matched}
    return joined, summary


def _write_atomically(out: Path, tables: dict[str, pl.DataFrame], info: dict) -> None:
    """Writes into a temporary sibling folder, then swaps it in: a failed run leaves OUT as it was."""
    with replaced_on_success(out) as tmp:
        for name, table in tables.items():
            table.write_parquet(tmp / name, statistics=False)
        (tmp / DATASET_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def load_prepared(folder: Path) -> PreparedData:
    """Loads a folder written by ``recserve data``, checking its version and files."""
    folder = Path(folder)
    missing = [n for n in (DATASET_FILE, ITEMS_FILE, SEQUENCES_FILE) if not (folder / n).is_file()]
    if missing:
        raise DataError(
            f"{folder}: not a prepared data folder, missing {', '.join(missing)}; run `recserve data` first"
        )
    info = json.loads((folder / DATASET_FILE).read_text()) | {"folder": str(folder)}
    if info.get("format_version") != DATA_FORMAT_VERSION:
        raise DataError(
            f"{folder}: data format version {info.get('format_version')!r}, this recserve reads "
            f"{DATA_FORMAT_VERSION}; prepare it again with `recserve data`"
        )
    items = pl.read_parquet(folder / ITEMS_FILE)
    users = pl.read_parquet(folder / SEQUENCES_FILE)
    ids = items["item_id"].to_numpy()
    sequences = sequences_from_frame(users)
    if "before_test" in users.columns:
        cuts = Cuts(
            users["before_valid"].to_numpy().astype(np.int64), users["before_test"].to_numpy().astype(np.int64), TIME
        )
    else:
        cuts = Cuts.leave_one_out(sequences)
    vocab = Vocab(ids=ids.astype(str) if ids.dtype.kind in "OUS" else ids.astype(np.int64))
    popularity = np.concatenate([[0], items["count"].to_numpy(), [0]]).astype(np.int64)
    titles = items["title"].to_numpy() if "title" in items.columns else None
    return PreparedData(
        vocab=vocab,
        user_ids=users["user_id"].to_numpy(),
        sequences=sequences,
        popularity=popularity,
        titles=titles,
        info=info,
        cuts=cuts,
    )
