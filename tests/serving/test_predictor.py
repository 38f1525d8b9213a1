"""The framework-free predictor: the defined answer for every odd input."""

from pathlib import Path

import numpy as np
import pytest
from tests.conftest import model_top_ids

from recserve.constants import MAX_REQUEST_ITEMS, MAX_RULE_ITEMS, POPULARITY_FILE
from recserve.errors import RequestError
from recserve.export.exporter import export_run
from recserve.serving.predictor import Predictor
from recserve.serving.requests import exclude_flags, parse_each, parse_request


@pytest.fixture(scope="module")
def predictor(tiny_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("pred") / "export"
    export_run(tiny_run, "eager", "fp32", out)
    return Predictor.load(out)


@pytest.fixture(scope="module")
def string_predictor(string_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("spred") / "export"
    export_run(string_run, "onnx", "fp32", out)
    return Predictor.load(out)


def test_unknown_ids_are_dropped_and_counted(predictor):
    with_unknown, clean = predictor.predict([np.array([1, 999_999, 2, -5, 3]), np.array([1, 2, 3])])
    assert with_unknown.unknown_ids == 2 and clean.unknown_ids == 0
    np.testing.assert_array_equal(with_unknown.item_ids, clean.item_ids)


def test_an_empty_or_unknown_history_gets_the_most_popular_items(predictor, tiny_run):
    counts = np.load(tiny_run / POPULARITY_FILE)[1:-1]
    popular = np.argsort(-counts, kind="stable")[:10] + 1  # ML-100K's item IDs equal their index
    assert len(set(np.sort(counts)[-11:])) == 11  # no tie among the top 11: the order is defined
    for history in (np.array([], dtype=np.int64), np.array([999_999])):
        answer = predictor.predict([history])[0]
        assert answer.item_ids.tolist() == popular.tolist()  # best first, not only the same ten
        assert np.all(np.diff(answer.scores) <= 0) and np.isfinite(answer.scores).all()


def test_a_history_longer_than_the_window_keeps_its_most_recent_items(predictor):
    recent = np.arange(100, 119)  # window 20: 19 items fit
    long = np.concatenate([np.arange(1, 60), recent])
    np.testing.assert_array_equal(predictor.predict([long])[0].item_ids, predictor.predict([recent])[0].item_ids)


def test_seen_items_are_excluded_unless_asked_not_to(predictor, tiny_run):
    from recserve.artifacts.catalogue import read_catalogue

    popularity = np.load(tiny_run / "popularity.npy")[1:-1]
    history = read_catalogue(tiny_run)[np.argsort(-popularity)[:18]]  # the most popular: some rank in the top 50
    seen_out = predictor.predict([history], 50, True)[0]
    assert not set(seen_out.item_ids) & set(history)
    kept = predictor.predict([history], 50, False)[0]
    assert np.all(np.diff(kept.scores) <= 0) and len(kept.item_ids) == 50
    want, clear = model_top_ids(tiny_run, [history], exclude_seen=False)  # the model's own top 10, seen kept
    assert clear[0] and kept.item_ids[:10].tolist() == want[0].tolist()
    assert set(kept.item_ids) & set(history), "no seen item in the top 50: the case shows nothing"


@pytest.mark.parametrize("k", [0, 101, -1])
def test_k_out_of_range_names_the_field_and_the_allowed_values(predictor, k):
    with pytest.raises(RequestError, match=rf"k: {k} is out of range; allowed 1..100"):
        predictor.predict([np.array([1])], k)


def test_string_ids_work_end_to_end_and_unknown_strings_are_dropped(string_predictor, string_run):
    answer = string_predictor.predict([np.array(["sku-001", "sku-002", "nope"])], 5)[0]
    assert answer.unknown_ids == 1 and answer.item_ids.dtype.kind == "U"
    want, clear = model_top_ids(string_run, [np.array(["sku-001", "sku-002"])])  # the unknown one dropped
    assert clear[0] and answer.item_ids.tolist() == want[0][:5].tolist()
    as_bytes = string_predictor.predict([np.array([b"sku-001", b"sku-002"], dtype=object)], 5)[0]
    np.testing.assert_array_equal(as_bytes.item_ids, answer.item_ids)


def test_a_catalogue_smaller_than_k_returns_only_the_unseen_items(string_predictor):
    catalogue = string_predictor.vocab_ids  # 30 SKUs
    five, two = catalogue[:5], catalogue[10:12]
    short, shorter = string_predictor.predict([five, two], k=len(catalogue))
    assert len(short.item_ids) == len(catalogue) - 5 and len(shorter.item_ids) == len(catalogue) - 2
    assert np.isfinite(short.scores).all() and not set(short.item_ids) & set(five)
    answers = string_predictor.answer([five, two], len(catalogue))  # as a server shell slices one request
    ids, scores = answers.rows(0, 2, len(catalogue))
    assert ids.shape == (2, len(catalogue) - 5) and np.isfinite(scores).all()


@pytest.mark.parametrize(
    ("item_ids", "k", "exclude", "message"),
    [
        (np.zeros((1, 2, 3), np.int64), None, None, r"expected shape \[batch, length\]"),
        (np.zeros((0, 3), np.int64), None, None, "holds no history"),
        (np.array([[1.5]]), None, None, "this model takes INT64"),
        (np.array([[b"a"]], dtype=object), None, None, "this model takes INT64"),
        (np.array([[1]]), np.array([[1.0]]), None, "k: wrong data type"),
        (np.array([[1], [2]]), np.array([[3], [4]]), None, "one k per request"),
        (np.array([[1]]), None, np.array([[1]]), "exclude_seen: wrong data type"),
        (np.ones((1, 4097), np.int64), None, None, "4097 items a row; at most 4096"),
    ],
)
def test_malformed_requests_name_the_field(item_ids, k, exclude, message):
    with pytest.raises(RequestError, match=message):
        parse_request(item_ids, k, exclude, max_k=100, string_ids=False)


def test_a_defect_met_while_reading_one_request_is_that_requests_error_alone(caplog):
    """Whatever a request's input makes the reading raise (a defect, not a RequestError) becomes its own error,
    in one line that names no code of the server's; the requests beside it are read as ever."""

    def parse(n):
        if n == 1:
            raise OverflowError("int too large to convert to float")
        return n

    parsed, good = parse_each([0, 1, 2], parse)
    assert good == [0, 2] and parsed[0] == 0 and parsed[2] == 2
    assert isinstance(parsed[1], RequestError) and str(parsed[1]) == (
        "the request could not be read (OverflowError); the server's log says why"
    )
    assert "int too large" in caplog.text  # the server's log keeps the cause


def test_recserves_backend_bounds_a_rows_items_and_listed_ids_as_the_python_layouts_do():
    source = (Path(__file__).parents[2] / "native" / "triton-backend" / "src" / "recserve.cc").read_text()
    assert f"kMaxAppended = {MAX_REQUEST_ITEMS};" in source
    assert f"kMaxRuleItems = {MAX_RULE_ITEMS};" in source


def test_exclude_flags_default_to_true_and_keep_each_rows_choice():
    default = parse_request(np.array([[1, 2]]), None, None, max_k=100, string_ids=False)
    chosen = parse_request(np.array([[1], [2]]), None, np.array([[False], [True]]), max_k=100, string_ids=False)
    assert exclude_flags([default, default]) is True
    np.testing.assert_array_equal(exclude_flags([default, chosen]), [True, False, True])


def test_the_serving_core_imports_only_numpy_and_torch():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import recserve.serving.predictor, recserve.serving.requests, recserve.export.backends\n"
        "import recserve.export.eager, recserve.export.torchscript, recserve.export.exporter\n"
        "heavy = {'polars', 'lightning', 'typer', 'rich', 'matplotlib', 'pyarrow', 'tritonclient', 'onnxruntime'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_empty_batch_gets_an_empty_answer(predictor):
    assert predictor.predict([]) == []


@pytest.mark.parametrize("vocab_ids", [np.array([0, 3, 7]), np.array([0, 3, 10**12])], ids=["table", "search"])
@pytest.mark.parametrize("map_ids", [False, True], ids=["graph-maps", "predictor-maps"])
def test_encode_pads_left_and_counts_only_history_ids_unknown(vocab_ids, map_ids):
    encoder = Predictor(runner=None, vocab_ids=vocab_ids, window=6, max_k=3, map_ids=map_ids)
    last = int(vocab_ids[-1])
    histories = [
        np.array([3, 0]),
        np.array([5, -1, 2**40, last, 0, 3]),
        np.array([], dtype=np.int64),
        np.array([7], dtype=np.uint64),
    ]
    batch = encoder.encode(histories)
    # ID 0 is an item here, so the padding's zeros must count neither as known nor as unknown history
    np.testing.assert_array_equal(batch.lengths, [2, 5, 0, 1])  # window 6 keeps 5 items and the mask token
    np.testing.assert_array_equal(batch.unknown, [0, 2, 0, 0 if last == 7 else 1])
    if map_ids:  # indices 1..N, 0 for unknown and for padding
        expected = [[0, 0, 0, 2, 1], [0, 0, 3, 1, 2], [0] * 5, [0, 0, 0, 0, 3 if last == 7 else 0]]
    else:
        expected = [[0, 0, 0, 3, 0], [-1, 2**40, last, 0, 3], [0] * 5, [0, 0, 0, 0, 7]]
    np.testing.assert_array_equal(batch.ids, expected)


def test_encode_refuses_non_integer_ids_for_an_integer_vocabulary():
    encoder = Predictor(runner=None, vocab_ids=np.array([1, 2, 3]), window=5, max_k=3, map_ids=False)
    with pytest.raises(RequestError, match="item_ids: integer IDs expected for this model, got float64"):
        encoder.encode([np.array([1, 2]), np.array([1.5])])


def test_an_onnx_export_is_served_without_torch(tiny_run, tmp_path):
    """What a Triton image for the fused layout over ONNX holds: numpy, onnxruntime and recserve, no torch."""
    import json
    import subprocess
    import sys

    from recserve.export.exporter import export_run
    from recserve.serving.predictor import Predictor

    export_run(tiny_run, "onnx", "fp32", tmp_path / "onnx")
    expected = Predictor.load(tmp_path / "onnx").predict([np.array([1, 2, 3])], k=5)[0].item_ids.tolist()
    script = (
        "import json, sys\n"
        "sys.modules['torch'] = sys.modules['polars'] = sys.modules['lightning'] = None  # importing them fails\n"
        "import numpy as np\n"
        "import recserve.serving.requests, recserve.serving.triton_repository.placement\n"
        "from recserve.serving.predictor import Predictor\n"
        "answer = Predictor.load(sys.argv[1]).predict([np.array([1, 2, 3])], k=5)[0]\n"
        "print(json.dumps(answer.item_ids.tolist()))\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "onnx")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected
