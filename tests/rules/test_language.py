"""The rule language over the item attributes: what each form lets through, and what each bad rule gets (an
error naming what to write, never a silent empty answer)."""

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recserve.artifacts.item_table import attributes_of
from recserve.errors import DataError
from recserve.rules.language import RuleError, compile_rule, parse
from recserve.rules.named import read_named_rules
from recserve.rules.rule_book import RequestRules, RuleBook

TABLE = pl.DataFrame(
    {
        "index": [1, 2, 3, 4, 5],
        "item_id": [10, 20, 30, 40, 50],
        "count": [1, 1, 1, 1, 1],
        "category": ["games", "books", None, "games", "toys"],
        "price": [5.0, 60.0, 20.0, None, 49.99],
        "adult": [True, False, None, False, False],
        "stock": [0, 3, 1, 7, 2],
    }
)
ATTRIBUTES = attributes_of(TABLE)


@pytest.mark.parametrize(
    ("rule", "allowed"),
    [
        ('category == "games"', [1, 0, 0, 1, 0]),
        ('category != "games"', [0, 1, 0, 0, 1]),  # a missing category satisfies no comparison
        ('category in ("games", "toys")', [1, 0, 0, 1, 1]),
        ('category not in ("games",)', [0, 1, 0, 0, 1]),
        ("price < 50", [1, 0, 1, 0, 1]),
        ("price >= 49.99", [0, 1, 0, 0, 1]),
        ("price > -1 and stock > 0", [0, 1, 1, 0, 1]),
        ("adult", [1, 0, 0, 0, 0]),
        ("not adult", [0, 1, 1, 1, 1]),  # not turns round what its operand gives (missing included)
        ("adult == false", [0, 1, 0, 1, 1]),
        ('category == "games" or (stock > 2 and not adult)', [1, 1, 0, 1, 0]),
        ('category == "toys" and price < 50 and not adult', [0, 0, 0, 0, 1]),
        ('category == "nothing here"', [0, 0, 0, 0, 0]),  # a value no item has yet: nothing, not an error
        ("stock in (1, 2, 3)", [0, 1, 1, 0, 1]),
        ('category in ("toys")', [0, 0, 0, 0, 1]),  # one value in parentheses, as people write it
    ],
)
def test_each_form_lets_through_what_docs_rules_says(rule, allowed):
    np.testing.assert_array_equal(compile_rule(rule, ATTRIBUTES), np.array(allowed, dtype=bool))


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("brand == 1", "no attribute 'brand'; the item table has category (string), price (number)"),
        ('price == "cheap"', "price is a number attribute and 'cheap' is not; write price < 10"),
        ("category == 3", "category is a string attribute and 3.0 is not"),
        ('category < "m"', "category is a string attribute; < orders numbers only"),
        ("stock", "stock is a number attribute; compare it, as in stock < 10"),
        ('category = "games"', "cannot be read at column 10 (compare with ==, not =)"),
        ("1 < price < 3", "one comparison at a time"),
        ("price + 1 > 3", "a comparison starts with an attribute's name"),
        ("__import__('os')", "is not part of the language"),
        ("category in price", "in takes a list of values"),
        ("price < stock", "stock is not a value"),
        ("price < 1" + "0" * 400, "past int64's range"),  # once an OverflowError past the request's check
        ("price > -1" + "0" * 30, "past int64's range"),
        ("price > 1e400", "not a finite number"),
        ("", "an empty rule"),
        ("x" * 3000, "at most 2000"),
        (" or ".join(["price < 1"] * 150), "too long"),
    ],
)
def test_each_bad_rule_gets_an_error_that_says_what_to_write(rule, message):
    with pytest.raises(RuleError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        compile_rule(rule, ATTRIBUTES)


def test_a_rule_is_parsed_once_and_its_tree_compiled_against_any_table():
    rule = parse("price < 50")
    assert compile_rule(rule, ATTRIBUTES).sum() == 3


def test_an_attribute_no_rule_could_name_is_refused_with_the_column():
    for frame, message in (
        (TABLE.with_columns(pl.Series("tags", [[1], [2], [3], [4], [5]])), "'tags' is of type List"),
        (TABLE.rename({"price": "class"}), "'class' is not a name a rule can use"),
        (TABLE.rename({"price": "2nd"}), "'2nd' is not a name a rule can use"),
        (TABLE.with_columns(pl.lit(None).alias("empty")), "'empty' holds no value at all"),
    ):
        with pytest.raises(DataError, match=message):
            attributes_of(frame)


def test_named_rules_files_are_checked(tmp_path):
    good = tmp_path / "rules.toml"
    good.write_text('in_stock = "stock > 0"\ncheap_games = \'category == "games" and price < 50\'\n')
    assert read_named_rules(good) == {"in_stock": "stock > 0", "cheap_games": 'category == "games" and price < 50'}
    for text, message in (
        ("in stock = 1", "cannot be read"),
        ('"a b" = "stock > 0"', "not a rule name"),
        ("x = 3", "a rule is a string"),
    ):
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(Exception, match=message):
            read_named_rules(bad)
    with pytest.raises(RuleError, match="no attribute 'brand'"):
        RuleBook(ATTRIBUTES, {"acme": 'brand == "acme"'})  # a bad named rule fails the load, not a request


def test_the_rule_book_gives_each_row_its_mask_and_keeps_hidden_items_out_of_every_one():
    book = RuleBook(ATTRIBUTES, {"in_stock": "stock > 0"})
    rows = [None, RequestRules(rule="in_stock"), RequestRules(where="price < 50", exclude=np.array([30]))]
    for r in rows[1:]:
        book.check(r)
    lookup = lambda ids: np.searchsorted(TABLE["item_id"].to_numpy(), ids) + 1  # noqa: E731
    batch = book.batch(rows, lookup)
    allowed = batch.masks[batch.mask_of_row][:, 1:-1]
    np.testing.assert_array_equal(allowed[0], [1, 1, 1, 1, 1])
    np.testing.assert_array_equal(allowed[1], [0, 1, 1, 1, 1])
    np.testing.assert_array_equal(allowed[2], [1, 0, 1, 0, 1])
    np.testing.assert_array_equal(batch.excluded[2], [3])  # item 30 is index 3
    assert not batch.masks[:, [0, -1]].any()  # padding and the mask token: never
    book.hide(np.array([True, False, False, False, True]))
    hidden = book.batch(rows, lookup)
    assert not hidden.masks[:, [1, 5]].any() and hidden.masks is not batch.masks  # a runner sees new masks
    with pytest.raises(RuleError, match="no rule named 'gone'; the repository stores in_stock"):
        book.check(RequestRules(rule="gone"))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(["games", "books", "toys", None]), min_size=1, max_size=30),
    st.lists(st.floats(min_value=-5, max_value=100, allow_nan=False) | st.none(), min_size=1, max_size=30),
    st.sampled_from(["==", "!=", "in", "not in"]),
    st.floats(min_value=-5, max_value=100, allow_nan=False),
    st.sampled_from(["<", "<=", ">", ">="]),
    st.sampled_from(["and", "or"]),
    st.booleans(),
)
def test_a_compiled_rule_agrees_with_the_rule_read_item_by_item(categories, prices, eq, bound, order, join, negate):
    """A property: the mask is what evaluating the rule on each item alone gives (missing: no comparison holds)."""
    n = min(len(categories), len(prices))
    table = pl.DataFrame(
        {"category": pl.Series(categories[:n], dtype=pl.String), "price": pl.Series(prices[:n], dtype=pl.Float64)}
    )
    value = '("games", "toys")' if eq in ("in", "not in") else '"games"'
    rule = f"category {eq} {value} {join} price {order} {bound!r}"
    rule = f"not ({rule})" if negate else rule
    got = compile_rule(rule, attributes_of(table))

    def holds(category, price):
        named = {"==": category == "games", "!=": category != "games", "in": category in ("games", "toys")}
        named["not in"] = category not in ("games", "toys")
        first = category is not None and named[eq]
        second = (
            price is not None
            and {"<": price < bound, "<=": price <= bound, ">": price > bound, ">=": price >= bound}[order]
        )
        both = (first and second) if join == "and" else (first or second)
        return not both if negate else both

    assert got.tolist() == [holds(c, p) for c, p in zip(categories[:n], prices[:n])]


def test_a_batch_of_more_written_rules_than_the_book_keeps_still_gets_each_its_own():
    """Past MAX_RULE_MASKS the least recently used written rules are dropped, but never a batch's own: a batch
    of more distinct rules than that holds them all for its call."""
    from recserve.constants import MAX_RULE_MASKS

    book = RuleBook(ATTRIBUTES)
    rows = [RequestRules(where=f"price < {n}") for n in range(MAX_RULE_MASKS + 6)]
    for rules in rows:
        book.check(rules)
    assert len(book.masks) <= MAX_RULE_MASKS + 1  # the book's bound between batches
    batch = book.batch(rows, lambda ids: ids)
    allowed = batch.masks[batch.mask_of_row][:, 1:-1]
    for n, row in enumerate(allowed):
        np.testing.assert_array_equal(row, compile_rule(f"price < {n}", ATTRIBUTES))


def test_a_new_rule_writes_its_own_row_and_a_device_copy_takes_that_row_alone():
    """A written rule seen first compiles into one row of the masks; the hand-out says so, and the runner's
    device copy, brought up to date row by row through new rules, evictions, growth and hides, always equals
    the masks (once every row was rebuilt and copied for each new rule: 79 ms at a million items)."""
    import torch

    from recserve.constants import MAX_RULE_MASKS
    from recserve.export.runner import DeviceMasks

    book, on_device = RuleBook(ATTRIBUTES, {"in_stock": "stock > 0"}), DeviceMasks(torch.device("cpu"))
    on_device(book.masks)
    for n in range(MAX_RULE_MASKS + 10):  # past the book's bound: the least recently used rows are taken again
        before = book.masks
        rules = RequestRules(where=f"price < {n}")
        book.check(rules)
        batch = book.batch([rules], lambda ids: ids)
        if before.shape == book.masks.shape:
            assert book.masks.rows_changed_since(before).tolist() == [batch.mask_of_row[0]]
        np.testing.assert_array_equal(on_device(batch.masks).numpy(), np.asarray(batch.masks))
        want = compile_rule(f"price < {n}", ATTRIBUTES) & ~book.hidden
        np.testing.assert_array_equal(batch.masks[batch.mask_of_row[0], 1:-1], want)
        if n % 20 == 7:
            book.hide(np.arange(5) == n // 20)
            assert book.masks.rows_changed_since(batch.masks) is None  # every row: copied whole
            np.testing.assert_array_equal(on_device(book.masks).numpy(), np.asarray(book.masks))
    assert len(book.masks) <= MAX_RULE_MASKS + 1  # bounded by what an exported graph takes (its masks dimension)


def test_each_row_of_a_batch_gets_its_own_listed_items_whatever_the_lists_lengths():
    """Rows with lists of different lengths (and none): each row's indices are its own list's, known ones first,
    padded with 0; a list of only unknown IDs keeps the never-allowed index for an include list."""
    book = RuleBook(ATTRIBUTES)
    rows = [
        RequestRules(exclude=np.array([20, 40])),
        None,
        RequestRules(exclude=np.array([99, 10, 50])),
        RequestRules(exclude=np.array([30])),
        RequestRules(include=np.array([99])),
    ]
    lookup = lambda ids: np.where(np.isin(ids, TABLE["item_id"].to_numpy()), ids // 10, 0)  # noqa: E731
    batch = book.batch(rows, lookup)
    assert batch.excluded.tolist() == [[4, 2, 0], [0, 0, 0], [5, 1, 0], [3, 0, 0], [0, 0, 0]]
    assert batch.included[4].tolist() == [6] and not batch.included[:4].any()


def test_a_value_no_item_holds_is_named_with_the_closest_ones_the_items_hold():
    """`category == "game"` lets nothing through: no error (a value may come with a later catalogue), but said,
    with the closest values the items hold; numbers and values the items hold say nothing."""
    from recserve.rules.language import values_no_item_holds

    said = values_no_item_holds(parse('category == "game" or category in ("toys", "boks") or price < 3'), ATTRIBUTES)
    assert said == [
        'rule \'category == "game" or category in ("toys", "boks") or price < 3\': no item\'s category is '
        "'game'; the closest it holds: 'games'",
        'rule \'category == "game" or category in ("toys", "boks") or price < 3\': no item\'s category is '
        "'boks'; the closest it holds: 'books', 'toys'",
    ]
    assert values_no_item_holds(parse('category != "games" and price < 50'), ATTRIBUTES) == []
