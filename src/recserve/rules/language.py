"""The rule language: a filter over the item table's attributes, parsed and checked once, compiled to a mask.

    category == "games" and price < 50 and not adult
    brand in ("acme", "globex") or (stock > 0 and category != "gift cards")

- a comparison is an attribute, an operator and a value: ``==`` ``!=`` for every attribute; ``<`` ``<=``
  ``>`` ``>=`` for numbers; ``in`` ``not in`` with a parenthesised list of values;
- a boolean attribute alone is true where it is true; ``and``, ``or``, ``not`` and parentheses combine;
- values are strings in quotes, numbers, and ``true`` / ``false``;
- an item whose attribute is missing satisfies no comparison on it (``!=`` and ``not in`` included), and
  ``not`` turns whatever its operand gives round.

A rule that names an unknown attribute, compares it with a value of another type, or orders strings is a
``RuleError`` naming what to write instead, never a silent empty answer. The text is read with Python's own
expression parser and then only these forms are accepted.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from recserve.artifacts.item_table import Attribute, ItemAttributes
from recserve.errors import RequestError

MAX_TEXT = 2000  # characters of one rule
MAX_NODES = 400  # parsed nodes of one rule (values of a list included)
MAX_INTEGER = 2**63 - 1  # an integer in a rule lies within int64 (a float within float64, finite)

ORDERING: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "<": np.less,
    "<=": np.less_equal,
    ">": np.greater,
    ">=": np.greater_equal,
}
OPERATORS = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.In: "in",
    ast.NotIn: "not in",
}
Value = str | float | bool


class RuleError(RequestError):
    """A rule that cannot be read or does not fit the item table; the message says what to write."""


@dataclass(frozen=True)
class Compare:
    attribute: str
    op: str  # a value of OPERATORS
    value: Value | tuple[Value, ...]


@dataclass(frozen=True)
class Flag:
    attribute: str  # a boolean attribute, true


@dataclass(frozen=True)
class Not:
    operand: Node


@dataclass(frozen=True)
class Both:
    operands: tuple[Node, ...]  # and


@dataclass(frozen=True)
class Either:
    operands: tuple[Node, ...]  # or


Node = Compare | Flag | Not | Both | Either


@dataclass(frozen=True)
class Rule:
    """A rule as written and as parsed."""

    text: str
    tree: Node


def parse(text: str) -> Rule:
    """Reads a rule.

    Raises:
        RuleError: text that is not a rule of this language (the message names the part and the fix).
    """
    if not isinstance(text, str) or not text.strip():
        raise RuleError('an empty rule: write a filter such as category == "games" and price < 50')
    if len(text) > MAX_TEXT:
        raise RuleError(f"a rule of {len(text)} characters: at most {MAX_TEXT}; store long ones by name")
    try:
        body = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as err:
        hint = " (compare with ==, not =)" if "=" in text and "==" not in text else ""
        raise RuleError(f"rule {text!r} cannot be read at column {err.offset}{hint}") from None
    if sum(1 for _ in ast.walk(body)) > MAX_NODES:
        raise RuleError(f"rule {text!r} is too long: at most {MAX_NODES} parts; store its values as an attribute")
    return Rule(text, _node(body, text))


def _node(node: ast.AST, text: str) -> Node:
    if isinstance(node, ast.BoolOp):
        operands = tuple(_node(v, text) for v in node.values)
        return Both(operands) if isinstance(node.op, ast.And) else Either(operands)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return Not(_node(node.operand, text))
    if isinstance(node, ast.Name) and node.id not in ("true", "false"):
        return Flag(node.id)
    if isinstance(node, ast.Compare):
        if len(node.ops) != 1:
            raise RuleError(f"rule {text!r}: one comparison at a time, as in price > 10 and price < 50")
        left, right, op = node.left, node.comparators[0], OPERATORS.get(type(node.ops[0]))
        if op is None:
            raise RuleError(f"rule {text!r}: use ==, !=, <, <=, >, >=, in or not in")
        if not isinstance(left, ast.Name) or left.id in ("true", "false"):
            raise RuleError(f"rule {text!r}: a comparison starts with an attribute's name, as in price < 50")
        if op in ("in", "not in"):
            if isinstance(right, ast.Tuple | ast.List | ast.Set):
                return Compare(left.id, op, tuple(_value(v, text) for v in right.elts))
            if isinstance(right, ast.Constant | ast.UnaryOp):  # ("games") is one value in parentheses
                return Compare(left.id, op, (_value(right, text),))
            raise RuleError(f'rule {text!r}: {op} takes a list of values, as in brand in ("a", "b")')
        return Compare(left.id, op, _value(right, text))
    raise RuleError(
        f"rule {text!r}: {ast.get_source_segment(text.strip(), node) or type(node).__name__} is not part of the "
        "language; write comparisons of attributes joined by and, or, not"
    )


def _value(node: ast.AST, text: str) -> Value:
    if isinstance(node, ast.Name) and node.id in ("true", "false"):
        return node.id == "true"
    segment = ast.get_source_segment(text.strip(), node) or type(node).__name__
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        value = node.operand.value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return _number(-value, segment, text)
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int | float):
        value = node.value
        return value if isinstance(value, str | bool) else _number(value, segment, text)
    raise RuleError(f'rule {text!r}: {segment} is not a value; write a "string", a number, true or false')


def _number(value: int | float, segment: str, text: str) -> float:
    """A number of a rule as the masks compare it: an integer within int64, a float finite in float64."""
    if isinstance(value, int) and not -MAX_INTEGER - 1 <= value <= MAX_INTEGER:
        raise RuleError(f"rule {text!r}: {segment:.40} is past int64's range; a number lies within +-{MAX_INTEGER}")
    if not math.isfinite(value):
        raise RuleError(f"rule {text!r}: {segment:.40} is not a finite number")
    return float(value)


def check(rule: Rule, attributes: ItemAttributes) -> None:
    """Raises RuleError where the rule names an attribute the item table has not, or compares one with a
    value it cannot equal or order."""
    for node in _leaves(rule.tree):
        attribute = attributes.columns.get(node.attribute)
        if attribute is None:
            raise RuleError(
                f"rule {rule.text!r}: no attribute '{node.attribute}'; the item table has {attributes.describe()}"
            )
        _check_leaf(rule, node, attribute)


def _leaves(node: Node):
    if isinstance(node, Compare | Flag):
        yield node
    elif isinstance(node, Not):
        yield from _leaves(node.operand)
    else:
        for operand in node.operands:
            yield from _leaves(operand)


def _check_leaf(rule: Rule, node: Compare | Flag, attribute: Attribute) -> None:
    name, kind = attribute.name, attribute.kind
    if isinstance(node, Flag):
        if kind != "bool":
            raise RuleError(
                f"rule {rule.text!r}: {name} is a {kind} attribute; compare it, as in {_example(attribute)}"
            )
        return
    values = node.value if isinstance(node.value, tuple) else (node.value,)
    wanted = {"string": str, "number": float, "bool": bool}[kind]
    wrong = [v for v in values if type(v) is not wanted]
    if wrong:
        raise RuleError(
            f"rule {rule.text!r}: {name} is a {kind} attribute and {wrong[0]!r} is not; write {_example(attribute)}"
        )
    if node.op in ORDERING and kind != "number":
        raise RuleError(f"rule {rule.text!r}: {name} is a {kind} attribute; {node.op} orders numbers only")


def values_no_item_holds(rule: Rule, attributes: ItemAttributes) -> list[str]:
    """A line for each string value the rule compares an attribute with that no item holds (``category ==
    "shoe"`` where the items hold "shoes"): a rule that lets nothing through for it, which is no error (a value may
    come with a later catalogue) but is said, naming the closest values the items hold."""
    import difflib

    said = []
    for node in _leaves(rule.tree):
        attribute = attributes.columns.get(node.attribute)
        if not isinstance(node, Compare) or attribute is None or attribute.kind != "string":
            continue
        held = [str(c) for c in attribute.categories] if attribute.categories is not None else []
        for value in node.value if isinstance(node.value, tuple) else (node.value,):
            if isinstance(value, str) and value not in held:
                close = difflib.get_close_matches(value, held, n=3, cutoff=0.5)
                hint = f"; the closest it holds: {', '.join(repr(c) for c in close)}" if close else ""
                said.append(f"rule {rule.text!r}: no item's {attribute.name} is {value!r}{hint}")
    return said


def _example(attribute: Attribute) -> str:
    if attribute.kind == "string":
        first = attribute.categories[0] if attribute.categories is not None and len(attribute.categories) else "x"
        return f'{attribute.name} == "{first}"'
    return f"{attribute.name} == true" if attribute.kind == "bool" else f"{attribute.name} < 10"


def compile_rule(rule: Rule | str, attributes: ItemAttributes) -> np.ndarray:
    """The items the rule lets through: (rows,) bool over the catalogue, in its order.

    Raises:
        RuleError: a rule that cannot be read or does not fit the item table.
    """
    rule = parse(rule) if isinstance(rule, str) else rule
    check(rule, attributes)
    return _mask(rule.tree, attributes)


def _mask(node: Node, attributes: ItemAttributes) -> np.ndarray:
    if isinstance(node, Not):
        return ~_mask(node.operand, attributes)
    if isinstance(node, Both | Either):
        combine = np.logical_and if isinstance(node, Both) else np.logical_or
        return combine.reduce([_mask(operand, attributes) for operand in node.operands])
    attribute = attributes.columns[node.attribute]
    if isinstance(node, Flag):
        return attribute.values == 1
    present = ~attribute.missing
    return present & _compare(attribute, node.op, node.value)


def _compare(attribute: Attribute, op: str, value: Value | tuple[Value, ...]) -> np.ndarray:
    values = value if isinstance(value, tuple) else (value,)
    if attribute.kind == "string":
        categories = attribute.categories if attribute.categories is not None else np.array([], dtype=str)
        codes = [int(np.searchsorted(categories, v)) for v in values]
        known = [c for c, v in zip(codes, values) if c < len(categories) and categories[c] == v]
        hit = _any_of(attribute.values, known)
    elif attribute.kind == "bool":
        hit = _any_of(attribute.values, [int(v) for v in values])
    elif op in ORDERING:
        return ORDERING[op](attribute.values, float(values[0]))
    else:
        hit = _any_of(attribute.values, [float(v) for v in values])
    return ~hit if op in ("!=", "not in") else hit


def _any_of(values: np.ndarray, wanted: list) -> np.ndarray:
    """Where ``values`` holds one of ``wanted``: a comparison a value for a few (np.isin sorts, 10x slower at a
    million items), np.isin for a long list."""
    if len(wanted) > 16:
        return np.isin(values, np.asarray(wanted, dtype=values.dtype))
    hit = np.zeros(len(values), dtype=bool)
    for value in wanted:
        hit |= values == value
    return hit
