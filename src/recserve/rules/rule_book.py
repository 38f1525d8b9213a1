"""A served model's business rules: the catalogue's attributes, the rules stored with the repository by name,
the items hidden catalogue-wide, and the masks compiled from them, which each batch's rows index on the device
(``models.serving_graph.allowed_items``).

The masks are one array (``masks``): row 0 every item but the hidden ones; then a row for each named rule
(compiled when the book is made, so a bad one fails the load, not a request) and for each rule written out in
a request (compiled on first use into a row of its own, the least recently used of those dropped past
``MAX_RULE_MASKS``; rows no rule holds are all false). They are handed out read-only, as a new object whenever
a row changes, which says what changed (``Masks.rows_changed_since``): a runner keeps its device copy until then, and
then copies the changed rows alone (a new written rule costs its own row, not every row again).
"""

from __future__ import annotations

from collections import OrderedDict, deque
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


class Masks(np.ndarray):
    """A rule book's masks as it hands them out (read-only), knowing which hand-out they are, so that a runner
    that holds a device copy of an earlier one copies only the rows changed since (``rows_changed_since``, the
    protocol ``export.backend_protocol.changed_rows`` asks)."""

    ledger: _Ledger | None
    generation: int

    def __array_finalize__(self, obj) -> None:
        self.ledger = getattr(obj, "ledger", None)
        self.generation = getattr(obj, "generation", -1)

    def rows_changed_since(self, earlier: object) -> np.ndarray | None:
        """The rows that differ from ``earlier`` (an earlier hand-out of the same book and shape), or None where
        a copy must be made whole (another book or shape, or changes no longer kept)."""
        if not isinstance(earlier, Masks) or self.ledger is None or self.ledger is not earlier.ledger:
            return None
        if self.shape != earlier.shape or earlier.generation > self.generation:
            return None
        return self.ledger.rows_since(earlier.generation, self.generation)


class _Ledger:
    """A book's recent changes: the rows each hand-out changed (None: every row), the last ``KEPT``."""

    KEPT = 256

    def __init__(self):
        self.changes: deque[tuple[int, tuple[int, ...] | None]] = deque(maxlen=self.KEPT)

    def rows_since(self, generation: int, now: int) -> np.ndarray | None:
        """The rows changed after hand-out ``generation`` up to ``now``, or None where that is not known."""
        if not self.changes or self.changes[0][0] > generation + 1:
            return None
        rows: set[int] = set()
        for changed_at, changed in self.changes:
            if generation < changed_at <= now:
                if changed is None:
                    return None
                rows.update(changed)
        return np.fromiter(sorted(rows), dtype=np.int64, count=len(rows))


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
        self._visible = np.ones(self.num_items, dtype=bool)
        self.named = {name: compile_rule(text, attributes) for name, text in (named or {}).items()}
        self.texts = dict(named or {})
        self._written: OrderedDict[tuple[str | None, str | None], np.ndarray] = OrderedDict()
        self._rows: dict[tuple[str | None, str | None], int] = {(None, None): EVERY_ITEM}
        self._rows |= {(name, None): row for row, name in enumerate(self.named, 1)}
        self._free: list[int] = []  # rows of dropped written rules, kept for the next ones
        self._buffer = np.zeros((len(self._rows), self.num_items + 2), dtype=bool)
        self._ledger, self._generation = _Ledger(), 0
        self.masks = self._fill(None)

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
        """Compiles a request's rule into a row of the masks (only that row is written); the least recently used
        written ones past ``MAX_RULE_MASKS`` are dropped, but never those of ``keep`` (a batch's own, which may
        then hold more)."""
        mask = np.ones(self.num_items, dtype=bool)
        if rules.rule is not None:
            mask &= self.named[rules.rule]
        if rules.where is not None:
            mask &= compile_rule(parse(rules.where), self.attributes)
        droppable = [key for key in self._written if key not in keep]
        while len(self._written) + len(self.named) >= MAX_RULE_MASKS and droppable:
            dropped = droppable.pop(0)
            del self._written[dropped]
            self._free.append(self._rows.pop(dropped))
        self._written[rules.key] = mask
        self._rows[rules.key] = self._free.pop() if self._free else self._grow()
        self.masks = self._fill([self._rows[rules.key]])

    def _grow(self) -> int:
        """A new row at the end of the masks: the buffer doubles (up to the rows an exported graph takes,
        ``MAX_RULE_MASKS`` + 1, more only for a batch of more rules), so a copy of it is made whole a few times in
        a model's life."""
        used = len(self._rows)
        if used == len(self._buffer):
            rows = max(min(2 * used, MAX_RULE_MASKS + 1), used + 1)
            grown = np.zeros((rows, self.num_items + 2), dtype=bool)
            grown[:used] = self._buffer
            self._buffer = grown  # another shape: a device copy is made whole
        taken = set(self._rows.values())
        return next(row for row in range(len(self._buffer)) if row not in taken)

    def hide(self, hidden: np.ndarray) -> None:
        """Replaces the hidden items: ``hidden`` (N,) bool over the catalogue."""
        if not np.array_equal(hidden, self.hidden):
            self.hidden = np.asarray(hidden, dtype=bool).copy()
            self._visible = ~self.hidden
            self.masks = self._fill(None)

    def _fill(self, rows: list[int] | None) -> Masks:
        """Writes ``rows`` of the masks (None: every one) by vocabulary index (padding and the mask token never
        allowed) and hands them out anew, read-only, the changed rows noted for the device copies."""
        keys = {row: key for key, row in self._rows.items()}
        for row in keys if rows is None else rows:
            self._buffer[row, 1:-1] = self._visible & self._mask(keys[row])
        self._generation += 1
        self._ledger.changes.append((self._generation, None if rows is None else tuple(rows)))
        masks = self._buffer.view(Masks)
        masks.flags.writeable = False
        masks.ledger, masks.generation = self._ledger, self._generation
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
