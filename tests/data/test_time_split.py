"""recserve data --split time: each user's first event after the test cut is the test target, the first after
the validation cut the validation target, training holds what lies before; cold targets reported apart; every
bad cut refused in one line."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from recserve.cli.main import app
from recserve.constants import DATASET_FILE
from recserve.data.datasets import PrepareOptions, load_prepared, prepare
from recserve.data.splits import SplitSettings
from recserve.errors import ConfigError, DataError

LOG = [  # user, item, timestamp; the cuts below: validation after 20, test after 30
    ("u1", "a", 10),
    ("u1", "b", 15),
    ("u1", "c", 25),  # u1's validation target
    ("u1", "d", 28),
    ("u1", "e", 35),  # u1's test target
    ("u1", "a", 40),  # past the first test event: dropped
    ("u2", "b", 12),
    ("u2", "a", 14),
    ("u2", "c", 16),  # no event after either cut: training only
    ("u3", "c", 22),  # nothing before the validation cut: no validation target (no history)
    ("u3", "a", 24),
    ("u3", "f", 33),  # u3's test target; f is in no event before it: cold
    ("u4", "a", 31),  # every event after the test cut: no history, left out
    ("u4", "b", 32),
    ("u4", "c", 34),
]

LATE_ONLY = [("u", "a", 1), ("u", "b", 2), ("u", "c", 3), ("v", "a", 10), ("v", "b", 11), ("v", "c", 12)]


def _prepare(tmp_path, rows=LOG, **options):
    """The log prepared with a time split (``options``: SplitSettings' fields)."""
    path = tmp_path / "log.csv"
    path.write_text("user_id,item_id,timestamp\n" + "".join(f"{u},{i},{t}\n" for u, i, t in rows))
    split = {"kind": "time", "test_after": "30", "valid_after": "20"} | options
    options = PrepareOptions(min_user_interactions=3, split=SplitSettings(**split))
    info = prepare(str(path), tmp_path / "out", options)
    return info, load_prepared(tmp_path / "out")


def _ids(data, indices):
    return data.vocab.to_ids(np.asarray(indices)).tolist()


def test_targets_are_each_users_first_event_after_each_cut_and_training_holds_what_lies_before(tmp_path):
    info, data = _prepare(tmp_path)
    users = data.user_ids.tolist()
    assert users == ["u1", "u2", "u3"]  # u4 has no event before the test cut
    assert info["split"] | {"target": None} == {
        "kind": "time",
        "test_after": 30.0,
        "valid_after": 20.0,
        "test_users": 2,
        "valid_users": 1,
        "users_only_after_test_cut": 1,
        "target": None,
    }
    test = data.test()
    assert [users[u] for u in test.users] == ["u1", "u3"]
    assert _ids(data, test.targets) == ["e", "f"]
    assert _ids(data, test.inputs.items) == ["a", "b", "c", "d", "c", "a"]  # every event before the target
    valid = data.valid()
    assert [users[u] for u in valid.users] == ["u1"] and _ids(data, valid.targets) == ["c"]
    assert _ids(data, valid.inputs.items) == ["a", "b"]
    assert _ids(data, data.train.items) == ["a", "b", "b", "a", "c"]  # at or before the validation cut
    assert _ids(data, data.refit_train.items) == ["a", "b", "c", "d", "b", "a", "c", "c", "a"]
    assert _ids(data, data.bags.items) == _ids(data, data.refit_train.items)  # Mult-VAE's: nothing after the cut
    # the popularity a model may know at the test cut: no event after it is counted (u4's, the test targets')
    counts = dict(zip(_ids(data, np.arange(1, data.vocab.num_items + 1)), data.popularity[1:-1].tolist(), strict=True))
    assert counts == {"a": 3, "b": 2, "c": 3, "d": 1, "e": 0, "f": 0}


def test_a_share_of_events_cuts_there_and_the_validation_window_defaults_to_the_tests_width(tmp_path):
    rows = [(f"u{u}", f"i{(u + t) % 7}", 10 * t + u) for u in range(10) for t in range(10)]  # 100 events
    info, _ = _prepare(tmp_path, rows, test_after="90%", valid_after=None)
    times = sorted(t for *_, t in rows)
    assert info["split"]["test_after"] == times[89]  # 90% of the events at or before the cut
    after = sum(t > info["split"]["test_after"] for t in times)
    assert sum(info["split"]["valid_after"] < t <= info["split"]["test_after"] for t in times) == after


def test_leave_one_out_folders_read_as_before(ml100k_dir):
    data = load_prepared(ml100k_dir)
    test = data.test()
    assert len(test.users) == data.sequences.num_users
    np.testing.assert_array_equal(test.targets, data.sequences.last(1))
    np.testing.assert_array_equal(data.valid().targets, data.sequences.last(2))
    np.testing.assert_array_equal(data.train.items, data.sequences.truncated(2).items)
    np.testing.assert_array_equal(data.bags.items, data.sequences.items)


@pytest.mark.parametrize(
    "options, said",
    [
        ({"test_after": "abc"}, "--test-after 'abc': give a timestamp"),
        ({"test_after": "150%"}, "--test-after '150%'"),
        ({"test_after": "nan"}, "--test-after 'nan'"),
        ({"test_after": "50"}, "no event after it (the last is at 40)"),
        ({"valid_after": "30"}, "--valid-after (30) must come before --test-after (30)"),
        ({"test_after": "5", "valid_after": "1", "rows": LATE_ONLY}, "no user has an event after the cut (5) and one"),
    ],
)
def test_a_bad_cut_is_refused_in_one_line_and_nothing_is_written(tmp_path, options, said):
    with pytest.raises(DataError) as err:
        _prepare(tmp_path, **options)
    assert said in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "options, said",
    [
        ({"test_after": None}, "split=time needs --test-after"),
        ({"kind": "leave-one-out"}, "add --split time"),
        ({"kind": "random"}, "split='random': expected one of leave-one-out, time"),
    ],
)
def test_options_that_make_no_split_are_refused(tmp_path, options, said):
    with pytest.raises(ConfigError) as err:
        _prepare(tmp_path, **options)
    assert said in str(err.value)


def test_user_item_lines_have_no_time_to_cut(tmp_path):
    (tmp_path / "log.txt").write_text("".join(f"{u} {i}\n" for u in range(1, 4) for i in range(1, 5)))
    result = CliRunner().invoke(
        app, ["data", str(tmp_path / "log.txt"), "--out", str(tmp_path / "out"), "--split", "time", "--test-after", "5"]
    )
    assert result.exit_code == 1 and "carry no timestamps" in result.output


def test_a_run_on_a_time_split_is_evaluated_on_it_with_its_cold_targets_apart(tmp_path):
    from recserve.data.io import read_ml100k

    log, _ = read_ml100k()
    log.write_csv(tmp_path / "ml.csv")
    args = ["data", str(tmp_path / "ml.csv"), "--out", str(tmp_path / "data"), "--split", "time"]
    prepared = CliRunner().invoke(app, args + ["--test-after", "90%"])
    assert prepared.exit_code == 0, prepared.output
    assert "time: test after" in prepared.output
    info = json.loads((tmp_path / "data" / DATASET_FILE).read_text())["split"]
    trained = CliRunner().invoke(
        app,
        ["train", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "run"), "--model", "sasrec",
         "--epochs", "1", "--samples-per-user", "1", "--hidden", "16", "--layers", "1", "--window", "20"],
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["test_users"] == info["test_users"] > 50
    assert metrics["split"]["kind"] == "time"
    data = load_prepared(tmp_path / "data")
    held = data.test()
    known = np.bincount(data.refit_train.items, minlength=data.vocab.size)
    cold = int((known[held.targets] == 0).sum())
    assert metrics["cold_targets"]["users"] == cold
    apart = metrics["test_apart"]["model"]
    warm_users, cold_users = len(held.targets) - cold, cold
    whole = metrics["test"]["full"]["hr@10"] * len(held.targets)
    parts = apart["warm"]["full"]["hr@10"] * warm_users + (apart["cold"]["full"]["hr@10"] * cold_users if cold else 0)
    assert whole == pytest.approx(parts)  # the parts are the whole's users, each counted once
