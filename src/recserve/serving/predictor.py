"""The framework-free serving core that every server shares (Triton python model, SageMaker, CLI).

It turns a batch of item-ID histories into the inference graph's padded inputs, runs one exported graph
(any backend), and cuts each request's answer to its own ``k``. Imports only numpy at module level; the
backend's runtime (torch or onnxruntime) is imported when an export is loaded.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from recserve.artifacts.catalogue import id_type_of, read_catalogue
from recserve.artifacts.export_manifest import ExportManifest
from recserve.artifacts.item_table import ItemAttributes, read_attributes
from recserve.constants import DEFAULT_K
from recserve.data.vocab import as_str_ids, lookup_table, use_lookup_table
from recserve.errors import RequestError
from recserve.export.backend_protocol import Runner
from recserve.rules.rule_book import RequestRules, RuleBook
from recserve.serving.requests import check_k

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recommendation:
    """One request's answer, best first."""

    item_ids: np.ndarray  # (k,) int64 or str
    scores: np.ndarray  # (k,) float32
    unknown_ids: int  # history IDs not in the vocabulary (dropped)


@dataclass(frozen=True)
class Answers:
    """A batch's answers as arrays, best first, for server shells to slice into their responses."""

    item_ids: np.ndarray  # (n, K) int64 or str; K is the batch's largest k
    scores: np.ndarray  # (n, K) float32; -inf where the catalogue ran out of items to offer
    unknown: np.ndarray  # (n,) int64 history IDs not in the vocabulary (dropped)
    complete: bool  # every score is finite (always, unless the catalogue is smaller than k)

    def rows(self, start: int, stop: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``start:stop`` cut to ``k`` columns, and to the columns every one of them fills."""
        ids, scores = self.item_ids[start:stop, :k], self.scores[start:stop, :k]
        if not self.complete:
            width = int(np.isfinite(scores).sum(1).min(initial=k))
            ids, scores = ids[:, :width], scores[:, :width]
        return np.ascontiguousarray(ids), np.ascontiguousarray(scores)

    def for_triton(self) -> Answers:
        """These answers as Triton sends them: string IDs as BYTES (numpy bytes), integer IDs as they are."""
        from recserve.data.vocab import as_bytes_ids

        return replace(self, item_ids=as_bytes_ids(self.item_ids)) if self.item_ids.dtype.kind == "U" else self


@dataclass(frozen=True)
class Batch:
    """A batch of histories as the graph takes them."""

    ids: np.ndarray  # (B, L) int64, left-padded
    lengths: np.ndarray  # (B,) int64
    unknown: np.ndarray  # (B,) int64 unknown IDs per request


class Predictor:
    """Histories of item IDs in, top-k recommendations out, for a batch of requests at once."""

    def __init__(
        self,
        runner: Runner,
        vocab_ids: np.ndarray,
        window: int,
        max_k: int,
        map_ids: bool,
        manifest: ExportManifest | None = None,
        rules: RuleBook | None = None,
    ):
        """
        Args:
            runner: the exported graph.
            vocab_ids: (N,) sorted item IDs.
            window: the model's window; histories keep their ``window - 1`` most recent items.
            max_k: the most items a request may ask for.
            map_ids: map IDs to indices here (the graph then takes and returns indices 1..N): string IDs,
                and sparse integer IDs on backends without a search operator.
            rules: the business rules every answer keeps to (default: none, and nothing hidden).
        """
        self.runner = runner
        self.vocab_ids = vocab_ids
        self.id_type = id_type_of(vocab_ids)  # "int64" or "string": the catalogue's, as it was decided
        self.string_ids = self.id_type == "string"
        self.map_ids = map_ids or self.string_ids
        self.history_limit = window - 1  # the graph appends the mask token
        self.max_k = max_k
        self.manifest = manifest
        self.fixed_length = manifest.fixed_length if manifest else None  # backends compiled for one padded length
        # dense integer IDs: membership by one gather (clipped: the table's last entry answers for every ID
        # past it) instead of a search
        self.member = lookup_table(vocab_ids) > 0 if use_lookup_table(vocab_ids) else None
        # a padded slot holds 0, which counts as known where 0 is an item ID (indices: 0 is never an item)
        self.pad_known = not self.map_ids and bool(self._known(np.zeros(1, dtype=np.int64))[0])
        self.rules = rules if rules is not None else RuleBook(ItemAttributes(len(vocab_ids), {}))

    @classmethod
    def load(cls, export_dir: Path, device: str = "cpu", named_rules: dict[str, str] | None = None) -> Predictor:
        """Loads an export folder written by ``recserve export`` (any backend), with the rules stored by name
        (``named_rules``) over the attributes its item table carries.

        Raises:
            RuleError: a named rule that does not fit the item table.
        """
        from recserve.export.backends import load_runner

        manifest = ExportManifest.read(export_dir)
        runner = load_runner(Path(export_dir), manifest, device)
        vocab_ids = read_catalogue(export_dir)
        map_ids = manifest.id_mapping == "predictor"
        rules = RuleBook(read_attributes(export_dir, len(vocab_ids)), named_rules)
        return cls(runner, vocab_ids, manifest.window, manifest.max_k, map_ids, manifest, rules)

    def indices(self, ids: np.ndarray) -> np.ndarray:
        """Vocabulary indices of item IDs (1..N), 0 for IDs the catalogue does not hold."""
        ids = np.asarray(ids).reshape(-1)
        if self.string_ids:
            ids = as_str_ids(ids).reshape(-1)
        elif ids.dtype.kind not in "iu":
            raise RequestError(f"item IDs: integer IDs expected for this model, got {ids.dtype}")
        return self._indices(ids).astype(np.int64)

    def _indices(self, ids: np.ndarray) -> np.ndarray:
        """``indices`` of IDs already of the catalogue's type."""
        return np.where(self._known(ids), np.searchsorted(self.vocab_ids, ids) + 1, 0)

    def encode(self, histories: Sequence[np.ndarray]) -> Batch:
        """Pads histories on the left after keeping each one's most recent ``window - 1`` items.

        Integer IDs go to the graph as they are (it maps them), unless this predictor maps IDs itself: then
        each ID becomes its 1-based rank in the vocabulary (0 if unknown), which is what that graph takes.
        """
        rows = [np.asarray(h).reshape(-1)[-self.history_limit :] for h in histories]
        if not self.string_ids and any(r.dtype.kind not in "iu" for r in rows):
            kinds = sorted({str(r.dtype) for r in rows if r.dtype.kind not in "iu"})
            raise RequestError(f"item_ids: integer IDs expected for this model, got {', '.join(kinds)}")
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        width = self.fixed_length or max(int(lengths.max(initial=0)), 1)
        if self.map_ids and rows:  # one search for the whole batch, then back into rows
            flat = np.concatenate(rows)
            rows = np.split(self._indices(flat), np.cumsum(lengths)[:-1])
        ids = np.zeros((len(rows), width), dtype=np.int64)
        for row, h in enumerate(rows):
            ids[row, width - len(h) :] = h  # left padding: the last len(h) columns
        known = (ids > 0) if self.map_ids else self._known(ids)
        unknown = lengths - known.sum(1) + (width - lengths) * self.pad_known  # padded slots are not history
        return Batch(ids=ids, lengths=lengths, unknown=unknown)

    def _known(self, ids: np.ndarray) -> np.ndarray:
        """Whether each ID (any shape) is in the vocabulary."""
        if self.member is not None:
            ids = ids.astype(np.int64, copy=False)  # unsigned IDs too (a gather takes signed indices)
            return np.take(self.member, ids, mode="clip") & (ids >= 0)
        pos = np.minimum(np.searchsorted(self.vocab_ids, ids), len(self.vocab_ids) - 1)
        return self.vocab_ids[pos] == ids if ids.size else np.zeros(ids.shape, dtype=bool)

    def check_k(self, k: int) -> int:
        return check_k(k, self.max_k)

    def answer(
        self,
        histories: Sequence[np.ndarray],
        k: int,
        exclude_seen: np.ndarray | bool = True,
        rules: Sequence[RequestRules | None] | None = None,
    ) -> Answers:
        """The top ``k`` of each history as arrays: one graph call for the whole batch.

        Args:
            histories: one item-ID array per request row (at least one).
            k: the batch's largest k (already checked against ``max_k``); rows that asked for fewer take a slice.
            exclude_seen: one flag per row, or one for all.
            rules: one entry per row (None: no rule), each checked (``self.rules.check``); the hidden items
                are kept out of every row.
        """
        n = len(histories)
        if self.string_ids:
            histories = [as_str_ids(h).reshape(-1) for h in histories]
        batch = self.encode(histories)
        exclude = (
            np.full(n, exclude_seen, dtype=bool)
            if np.ndim(exclude_seen) == 0
            else np.broadcast_to(np.asarray(exclude_seen, dtype=bool), (n,)).copy()
        )
        on_rows = self.rules.batch(list(rules) if rules is not None else [None] * n, self.indices)
        top_ids, top_scores = self.runner(batch.ids, batch.lengths, exclude, *on_rows.arrays(), k=k)
        top_ids, top_scores = top_ids[:, :k], top_scores[:, :k]
        if self.map_ids:
            top_ids = self.vocab_ids[np.clip(top_ids - 1, 0, len(self.vocab_ids) - 1)]
        # fewer than k items remain in tiny catalogues, and where rules let fewer through
        return Answers(top_ids, top_scores, batch.unknown, bool(np.isfinite(top_scores).all()))

    def predict(
        self,
        histories: Sequence[np.ndarray],
        k: Sequence[int] | int = DEFAULT_K,
        exclude_seen: Sequence[bool] | np.ndarray | bool = True,
    ) -> list[Recommendation]:
        """Top-k for each history: one graph call for the whole batch."""
        n = len(histories)
        if n == 0:
            return []
        ks = [self.check_k(x) for x in np.broadcast_to(k, (n,))]
        answers = self.answer(
            histories, max(ks), exclude_seen if isinstance(exclude_seen, bool) else np.asarray(exclude_seen)
        )
        out = []
        for row, kk in enumerate(ks):
            ids, scores = answers.rows(row, row + 1, kk)
            out.append(Recommendation(ids[0], scores[0], int(answers.unknown[row])))
        return out
