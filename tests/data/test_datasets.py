"""recserve data: every source kind, both ID types, determinism, the split and each bad input."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from recserve.constants import DATASET_FILE, ITEMS_FILE, SEQUENCES_FILE
from recserve.data.datasets import PrepareOptions, load_prepared, prepare
from recserve.data.io import Columns
from recserve.errors import ConfigError, DataError

LOG = [  # user, item, timestamp: u1 has a tie at t=5 that must keep file order
    ("u1", "b", 1),
    ("u1", "a", 5),
    ("u1", "c", 5),
    ("u1", "d", 9),
    ("u2", "c", 2),
    ("u2", "a", 3),
    ("u2", "b", 4),
    ("u3", "d", 1),
    ("u3", "c", 2),  # only 2 interactions: dropped with min_user_interactions=3
]


def _write_csv(path, rows=LOG, header="user_id,item_id,timestamp"):
    path.write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return path


def test_ml100k_summary_matches_the_published_counts(ml100k_dir):
    info = json.loads((ml100k_dir / DATASET_FILE).read_text())
    assert (info["users"], info["items"], info["interactions"]) == (943, 1682, 100_000)
    assert info["source"] == "ml-100k" and info["options"]["min_user_interactions"] == 5
    data = load_prepared(ml100k_dir)
    assert data.titles[0] == "Toy Story"
    assert data.vocab.ids[0] == 1 and data.vocab.mask_index == 1683
    assert data.popularity.sum() == 100_000 and data.popularity[0] == 0 and data.popularity[-1] == 0


def test_string_ids_keep_sorted_order_ties_keep_file_order_and_split_is_leave_one_out(tmp_path):
    prepare(str(_write_csv(tmp_path / "log.csv")), tmp_path / "out", PrepareOptions(min_user_interactions=3))
    data = load_prepared(tmp_path / "out")
    assert list(data.vocab.ids) == ["a", "b", "c", "d"]
    users = pl.read_parquet(tmp_path / "out" / SEQUENCES_FILE)
    assert users["user_id"].to_list() == ["u1", "u2"]
    u1 = data.vocab.to_ids(np.array(users["items"][0].to_list()))
    assert list(u1) == ["b", "a", "c", "d"]  # a and c share t=5; file order kept
    assert data.vocab.to_ids(np.array([users["valid_item"][0], users["test_item"][0]])).tolist() == ["c", "d"]
    assert data.train.lengths.tolist() == [2, 1]


def test_integer_ids_stay_integers(tmp_path):
    rows = [(1, 30, 1), (1, 10, 2), (1, 20, 3), (2, 10, 1), (2, 20, 2), (2, 30, 3)]
    prepare(str(_write_csv(tmp_path / "log.csv", rows)), tmp_path / "out", PrepareOptions(min_user_interactions=3))
    data = load_prepared(tmp_path / "out")
    assert data.vocab.ids.dtype == np.int64 and data.vocab.ids.tolist() == [10, 20, 30]
    assert json.loads((tmp_path / "out" / DATASET_FILE).read_text())["item_id_type"] == "int64"


def test_two_runs_write_identical_files(tmp_path):
    log = _write_csv(tmp_path / "log.csv")
    for name in ("a", "b"):
        prepare(str(log), tmp_path / name, PrepareOptions(min_user_interactions=3))
    for file in (ITEMS_FILE, SEQUENCES_FILE, DATASET_FILE):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()


def test_movielens_ratings_dat_and_u_data(tmp_path):
    rows = [(1, 5, 4, 100), (1, 6, 2, 101), (1, 7, 5, 102), (2, 5, 5, 50), (2, 7, 3, 40), (2, 6, 4, 60)]
    (tmp_path / "ratings.dat").write_text("".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in rows))
    (tmp_path / "u.data").write_text("".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in rows))
    for name in ("ratings.dat", "u.data"):
        info = prepare(str(tmp_path / name), tmp_path / f"out-{name}", PrepareOptions(min_user_interactions=3))
        assert (info["users"], info["items"], info["source_kind"]) == (2, 3, "movielens")
    data = load_prepared(tmp_path / "out-u.data")
    assert data.vocab.to_ids(data.sequences.items[3:]).tolist() == [7, 5, 6]  # user 2 by time


def test_rating_threshold_keeps_implicit_positives(tmp_path):
    rows = [(1, 5, 4, 1), (1, 6, 2, 2), (1, 7, 5, 3), (1, 8, 4, 4)]
    (tmp_path / "u.data").write_text("".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in rows))
    info = prepare(str(tmp_path / "u.data"), tmp_path / "out", PrepareOptions(3, rating_threshold=3.5))
    assert info["interactions"] == 3 and info["options"]["rating_threshold"] == 3.5


def test_parquet_with_custom_column_names_and_dedup(tmp_path):
    frame = pl.DataFrame({"who": [1, 1, 1, 1, 1], "sku": ["x", "y", "x", "z", "w"], "ts": [1, 2, 3, 4, 5]})
    frame.write_parquet(tmp_path / "log.parquet")
    options = PrepareOptions(min_user_interactions=3, dedup=True, columns=Columns("who", "sku", "ts"))
    info = prepare(str(tmp_path / "log.parquet"), tmp_path / "out", options)
    assert info["interactions"] == 4  # the second x is a repeat


def test_text_sequences_use_line_order(tmp_path):
    (tmp_path / "seq.txt").write_text("1 3\n1 1\n1 2\n2 2\n2 3\n2 1\n")
    prepare(str(tmp_path / "seq.txt"), tmp_path / "out", PrepareOptions(min_user_interactions=3))
    data = load_prepared(tmp_path / "out")
    assert data.vocab.to_ids(data.sequences.items).tolist() == [3, 1, 2, 2, 3, 1]


def test_min_item_filter_drops_rare_items(tmp_path):
    rows = [*LOG[:7], ("u2", "rare", 8)]
    info = prepare(
        str(_write_csv(tmp_path / "l.csv", rows)), tmp_path / "o", PrepareOptions(3, min_item_interactions=2)
    )
    assert info["items"] == 3 and info["interactions"] == 6  # "rare" and "d" appear once each


@pytest.mark.parametrize(
    ("content", "name", "message"),
    [
        (None, "missing.csv", "no such file"),
        ("user_id,item,timestamp\n1,2,3\n", "log.csv", "missing item column 'item_id'"),
        ("user_id,item_id,timestamp\n", "log.csv", "holds no interactions"),
        ("user_id,item_id,timestamp\n1,2,3\n1,3,yesterday\n", "log.csv", "row 2 holds 'yesterday'"),
        ("1 2\n1 2 3\n", "seq.txt", "line 2 is '1 2 3'"),
        ("1::2::3\n", "ratings.dat", "line 1 has 3 fields"),
        ("x", "log.json", "unknown source"),
    ],
)
def test_bad_input_gets_one_clear_error_and_writes_nothing(tmp_path, content, name, message):
    if content is not None:
        (tmp_path / name).write_text(content)
    with pytest.raises(DataError, match=message):
        prepare(str(tmp_path / name), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_failed_run_leaves_the_previous_folder_untouched(tmp_path):
    log = _write_csv(tmp_path / "log.csv")
    prepare(str(log), tmp_path / "out", PrepareOptions(min_user_interactions=3))
    before = (tmp_path / "out" / SEQUENCES_FILE).read_bytes()
    (tmp_path / "bad.csv").write_text("user_id,item_id,timestamp\n1,2,noon\n")
    with pytest.raises(DataError):
        prepare(str(tmp_path / "bad.csv"), tmp_path / "out")
    assert (tmp_path / "out" / SEQUENCES_FILE).read_bytes() == before


def test_options_below_the_split_minimum_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="min_user_interactions=2"):
        prepare("ml-100k", tmp_path / "out", PrepareOptions(min_user_interactions=2))


def test_everything_filtered_out_is_an_error(tmp_path):
    with pytest.raises(DataError, match="no interactions left"):
        prepare(str(_write_csv(tmp_path / "l.csv")), tmp_path / "out", PrepareOptions(min_user_interactions=50))


def test_window_sampling_left_pads_short_histories(ml100k_dir):
    seq = load_prepared(ml100k_dir).sequences
    windows = seq.windows(np.array([0]), np.array([2]), 4)
    assert windows.tolist() == [[0, 0, *seq.items[:2].tolist()]]


def test_the_item_table_names_its_own_id_column(tmp_path):
    """Once the item table had to use the log's ID column name: the shop's own (`product_ref`) is an option."""
    from typer.testing import CliRunner

    from recserve.cli.main import app

    log = _write_csv(tmp_path / "log.csv", header="user_id,sku,timestamp")
    (tmp_path / "items.csv").write_text("product_ref,price\na,5\nb,7\nc,9\nd,1\n")
    args = [
        "data",
        str(log),
        "--item-col",
        "sku",
        "--min-user-interactions",
        "3",
        "--items",
        str(tmp_path / "items.csv"),
    ]
    missing = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "no")], env={"COLUMNS": "200"})
    said = " ".join(missing.output.split())
    assert missing.exit_code == 1 and "no item column 'sku'" in said and "--items-id-col" in said, said
    named = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "out"), "--items-id-col", "product_ref"])
    assert named.exit_code == 0, named.output
    items = pl.read_parquet(tmp_path / "out" / ITEMS_FILE)
    assert items.select("item_id", "price").rows() == [("a", 5), ("b", 7), ("c", 9), ("d", 1)]
