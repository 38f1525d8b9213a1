"""A served model's business rules: the catalogue's attributes, the rules stored with the repository by name,
the items hidden catalogue-wide, and the masks compiled from them, which each batch's rows index on the device
(``models.serving_graph.allowed_items``).

The masks are one array (``masks``): row 0 every item but the hidden ones; then a row for each named rule
(compiled when the book is made, so a bad one fails the load, not a request) and for each rule written out in
a request (compiled on first use, the least recently used of those dropped past ``MAX_RULE_MASKS``). The array
is read-only and made anew whenever a row changes, so a runner keeps its device copy until it does.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from recserve.artifacts.item_table import ItemAttributes
from recserve.constants import INPUT_RULE, MAX_RULE_ITEMS, MAX_RULE_MASKS
from recserve.errors import RequestError
from recserve.rules.language import RuleError, compile_rule, parse

EVERY_ITEM = 0  # the masks' row of every item but the hidden ones


@dataclass(frozen=True)
class RequestRules:
    """What one request keeps out of its answer (every row of it alike)."""

    rule: str | None = None  # a rule stored by name
    where: str | None = None  # a rule written out
    exclude: np.ndarray | None = None  # item IDs never to recommend
    include: np.ndarray | None = None  # the only item IDs to recommend

    @property
    def key(self) -> tuple[str | None, str | None]:
        """The mask this request's rows take: its rule's and its written rule's, both or neither."""
        return self.rule, self.where


@dataclass(frozen=True)
class BatchRules:
    """A batch's rules as the graph takes them: the masks, each row's mask, and each row's excluded and
    included items as vocabulary indices (padding 0 past a row's own)."""

    masks: np.ndarray
    mask_of_row: np.ndarray
    excluded: np.ndarray
    included: np.ndarray

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.masks, self.mask_of_row, self.excluded, self.included


class RuleBook:
    def __init__(self, attributes: ItemAttributes, named: dict[str, str] | None = None):
        """
        Args:
            attributes: the catalogue's attributes, in its order.
            named: rules stored by name (``recserve repo --rules``).

        Raises:
            RuleError: a named rule that cannot be read or does not fit the attributes.
        """
        self.attributes = attributes
        self.num_items = attributes.rows
        self.hidden = np.zeros(self.num_items, dtype=bool)
        self.named = {name: compile_rule(text, attributes) for name, text in (named or {}).items()}
        self.texts = dict(named or {})
        self._written: OrderedDict[tuple[str | None, str | None], np.ndarray] = OrderedDict()
        self._rows: dict[tuple[str | None, str | None], int] = {}
        self.masks = self._build()

    def check(self, rules: RequestRules) -> None:
        """Compiles the request's rule where it has not been (so a bad one fails its request alone).

        Raises:
            RuleError: an unknown rule name, or a written rule that cannot be read or does not fit.
        """
        if rules.rule is not None and rules.rule not in self.named:
            stored = ", ".join(sorted(self.named)) or "none (recserve repo --rules FILE stores them)"
            raise RuleError(f"{INPUT_RULE}: no rule named {rules.rule!r}; the repository stores {stored}")
        if rules.key not in self._rows and rules.key != (None, None):
            self._remember(rules)

    def _remember(self, rules: RequestRules, keep: frozenset = frozenset()) -> None:
        """Compiles a request's rule into the masks; the least recently used written ones past
        ``MAX_RULE_MASKS`` are dropped, but never those of ``keep`` (a batch's own, which may then hold more)."""
        mask = np.ones(self.num_items, dtype=bool)
        if rules.rule is not None:
            mask &= self.named[rules.rule]
        if rules.where is not None:
            mask &= compile_rule(parse(rules.where), self.attributes)
        self._written[rules.key] = mask
        droppable = [key for key in self._written if key not in keep and key != rules.key]
        while len(self._written) + len(self.named) > MAX_RULE_MASKS and droppable:
            del self._written[droppable.pop(0)]
        self.masks = self._build()

    def hide(self, hidden: np.ndarray) -> None:
        """Replaces the hidden items: ``hidden`` (N,) bool over the catalogue."""
        if not np.array_equal(hidden, self.hidden):
            self.hidden = np.asarray(hidden, dtype=bool).copy()
            self.masks = self._build()

    def _build(self) -> np.ndarray:
        """Every row of the masks, by vocabulary index (padding and the mask token never allowed)."""
        keys: list[tuple[str | None, str | None]] = [(None, None)]
        keys += [(name, None) for name in self.named if (name, None) not in self._written]
        keys += list(self._written)
        masks = np.zeros((len(keys), self.num_items + 2), dtype=bool)
        for row, key in enumerate(keys):
            masks[row, 1:-1] = ~self.hidden & self._mask(key)
        self._rows = {key: row for row, key in enumerate(keys)}
        masks.flags.writeable = False
        return masks

    def _mask(self, key: tuple[str | None, str | None]) -> np.ndarray:
        if key in self._written:
            return self._written[key]
        if key[0] is not None and key[1] is None:
            return self.named[key[0]]
        return np.ones(self.num_items, dtype=bool)

    def batch(self, rows: list[RequestRules | None], to_indices) -> BatchRules:
        """The graph's rule inputs for a batch: ``rows`` one entry a row (None: no rule), every rule already
        checked; ``to_indices`` maps item IDs to vocabulary indices (0 for IDs not in the catalogue)."""
        used = frozenset(r.key for r in rows if r is not None)
        for rules in rows:
            if rules is None:
                continue
            if rules.key not in self._rows:  # dropped since its check
                self._remember(rules, keep=used)
            elif rules.key in self._written:
                self._written.move_to_end(rules.key)  # used: the last to be dropped
        mask_of_row = np.array([self._rows[r.key] if r else EVERY_ITEM for r in rows], dtype=np.int64)
        return BatchRules(
            self.masks,
            mask_of_row,
            _listed([r.exclude if r else None for r in rows], to_indices),
            _listed([r.include if r else None for r in rows], to_indices, never=self.num_items + 1),
        )


def _listed(lists: list[np.ndarray | None], to_indices, never: int | None = None) -> np.ndarray:
    """Per row the vocabulary indices of its listed IDs, known ones first, padded with 0 to the longest list:
    (B, max(1, E)); one mapping of every row's IDs at once.

    ``never``: an index no rule allows (the mask token's); a row that lists only IDs the catalogue does not
    hold keeps it, so that its list still restricts it (to nothing)."""
    sizes = np.fromiter((0 if ids is None else len(ids) for ids in lists), dtype=np.int64, count=len(lists))
    out = np.zeros((len(lists), max(int(sizes.max(initial=0)), 1)), dtype=np.int64)
    if not sizes.any():
        return out
    flat = to_indices(np.concatenate([ids for ids in lists if ids is not None and len(ids)]))
    rows = np.repeat(np.arange(len(lists)), sizes)
    out[rows, np.arange(len(flat)) - np.repeat(np.cumsum(sizes) - sizes, sizes)] = flat
    out = -np.sort(-out, axis=1)  # the known indices first: a row whose first is padding lists nothing
    if never is not None:
        out[(sizes > 0) & (out[:, 0] == 0), 0] = never
    return out


def check_listed(name: str, ids: np.ndarray | None) -> np.ndarray | None:
    """A request's list of item IDs to exclude or include, as one flat array.

    Raises:
        RequestError: more than ``MAX_RULE_ITEMS`` IDs.
    """
    if ids is None:
        return None
    flat = np.asarray(ids).reshape(-1)
    if len(flat) > MAX_RULE_ITEMS:
        raise RequestError(f"{name}: {len(flat)} items; at most {MAX_RULE_ITEMS}")
    return flat
