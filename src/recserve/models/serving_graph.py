"""The serving graph: item IDs in, top-k item IDs and scores out, in one module.

Inside: ID to index mapping (a sorted ID table and a search; unknown IDs become padding), the most recent
``window - 1`` items, the mask token, the encoder, the hidden state at the mask position only, removal of
special tokens and (per request) of already-seen items, a popularity fallback for histories with no known
item, top-k and index to ID mapping. No data-dependent Python control flow, so it traces, scripts and
exports with dynamic batch and length axes. String IDs are mapped to their 1-based rank in the vocabulary
outside the graph (tensors cannot hold strings), so the graph's ID table is then simply 1..N.
"""

from __future__ import annotations

import copy
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from recserve.constants import NATIVE_PAD_ID, PAD_INDEX
from recserve.data.vocab import lookup_table, use_lookup_table
from recserve.errors import ConfigError
from recserve.models.bert4rec import Bert4Rec
from recserve.models.multvae import MultVAE
from recserve.models.sasrec import SASRec


def ids_to_indices(
    table: torch.Tensor, lut: torch.Tensor | None, item_ids: torch.Tensor, valid: torch.Tensor, lut_last: int
) -> torch.Tensor:
    """Maps IDs to vocabulary indices: a gather where ``lut`` is set, else a binary search in ``table``.

    Args:
        table: (N,) sorted item IDs.
        lut: (M + 2,) index by ID for dense IDs up to M, and a last entry 0, or None to search ``table`` instead.
        item_ids: (B, L) IDs.
        valid: (B, L) False at padding positions.
        lut_last: M + 1, the last entry's position (a plain number, so traced graphs keep it a constant);
            unused without ``lut``.

    Returns:
        (B, L) indices 1..N, and padding (0) for unknown IDs and padding positions.
    """
    if lut is not None:  # decided when the graph is built, never by the data
        # negative IDs, IDs past the table and padded positions all look up the last entry: padding
        return lut[torch.where(valid & (item_ids >= 0), item_ids, lut_last).clamp(max=lut_last)]
    pos = torch.searchsorted(table, item_ids).clamp(max=table.shape[0] - 1)
    found = (table[pos] == item_ids) & valid
    return torch.where(found, pos + 1, torch.zeros_like(pos))


def allowed_items(
    masks: torch.Tensor, mask_of_row: torch.Tensor, excluded: torch.Tensor, included: torch.Tensor
) -> torch.Tensor:
    """Each row's allowed items: its catalogue-wide mask, less its own excluded items and, where it lists
    items to include, less every item it does not list.

    Args:
        masks: (R, V) bool by vocabulary index: the masks this batch's rows use (hidden items, a rule).
        mask_of_row: (B,) int64: each row's mask.
        excluded: (B, E) int64 vocabulary indices the row excludes besides; padding (0) where it has fewer.
        included: (B, I) int64 vocabulary indices, the only items the row may hold where its first is not
            padding (0); padding past them.

    Returns:
        (B, V) bool.
    """
    return _drop_unlisted(_masked_rows(masks, mask_of_row, excluded), included)


def _masked_rows(masks: torch.Tensor, mask_of_row: torch.Tensor, excluded: torch.Tensor) -> torch.Tensor:
    """Each row's mask less its excluded items (``allowed_items``): a fresh tensor, changed in place."""
    allowed = masks.index_select(0, mask_of_row)
    return allowed.scatter_(1, excluded, torch.zeros_like(excluded, dtype=torch.bool))


def _drop_unlisted(allowed: torch.Tensor, included: torch.Tensor) -> torch.Tensor:
    """``allowed`` less, in each row that lists items to include, every item it does not list (in place)."""
    listed = torch.zeros_like(allowed).scatter_(1, included, torch.ones_like(included, dtype=torch.bool))
    listed |= included[:, :1] == 0
    return allowed.logical_and_(listed)


def _seen(tokens: torch.Tensor, exclude_seen: torch.Tensor) -> torch.Tensor:
    """tokens: (B, L); exclude_seen: (B,) bool. Returns (B, L): the indices to score -inf, the tokens where
    the row excludes its seen items and padding (0, -inf anyway) where it keeps them."""
    return torch.where(exclude_seen[:, None], tokens, PAD_INDEX)


def _known(tokens: torch.Tensor) -> torch.Tensor:
    """tokens: (B, L) with the mask token last. Returns (B, 1) bool: the row holds an item besides it."""
    return (tokens > PAD_INDEX).sum(1, keepdim=True) > 1


def top_k_of_lists(
    scores: torch.Tensor, top_scores: torch.Tensor, top_indices: torch.Tensor, included: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top k of each row that lists items to keep to (``allowed_items``' included), taken over its list
    alone; the other rows keep the top k given. A (B, I) gather and top k, not a pass over the catalogue.

    Args:
        scores: (B, V) scores that already hold every other rule (-inf where one keeps an item out).
        top_scores, top_indices: (B, K) the top k of ``scores``.
        included: (B, I) vocabulary indices as ``allowed_items`` takes them.

    Returns:
        (B, K) scores and indices, best first; past a short list -inf.
    """
    listed = included.sort(1).values
    repeated = F.pad(listed[:, 1:] == listed[:, :-1], (1, 0), value=False)  # an item listed twice counts once
    listed = torch.where(repeated, torch.zeros_like(listed), listed)  # padding: -inf, as special tokens score
    width = top_scores.shape[1]
    candidates = F.pad(scores.gather(1, listed), (0, width), value=float("-inf"))  # at least K wide
    best, position = candidates.topk(width, dim=1)
    best_indices = F.pad(listed, (0, width), value=PAD_INDEX).gather(1, position)
    keeps = included[:, :1] != PAD_INDEX
    return torch.where(keeps, best, top_scores), torch.where(keeps, best_indices, top_indices)


TOP_K_CHUNK = 256  # items a chunk in ``chunked_top_k``: the fastest of 256 and 1024 at batch 16 and 64 (H100)


def chunked_top_k(
    scores: torch.Tensor, k: int, columns: torch.Tensor, width: int, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact top ``k`` scores of each row of (B, V) ``scores`` and their indices, best first: each chunk's
    largest score, the ``k`` chunks with the largest, then the top k of their items and of the columns past
    the last whole chunk. Every item of the top k lies in a chunk whose largest score is at least the k-th's, so
    the scores are ``topk``'s (indices may differ between equal scores). ``topk``'s radix select reads the whole
    row in several passes; this reads it once and sorts the k best chunks' items: at 1M items on an H100, 0.21
    against 0.56 ms at batch 64, 0.12 against 0.18 at batch 16 (``benchmarks/output_layer_speed.py``).

    Args:
        columns: (C,) 0..C-1 on the scores' device.
        width: V, the scores' columns; chunk: C, the chunk's width; at least k whole chunks in V. Python ints,
            not the tensors' shapes: a traced graph keeps them as constants, where arithmetic on traced shapes
            became tensors that a GPU's graph reads back to the host, which a CUDA graph's capture refuses.
    """
    whole = width // chunk * chunk
    largest = scores[:, :whole].unflatten(1, (whole // chunk, chunk)).amax(2)  # (B, V // C)
    best = largest.topk(k, 1).indices  # (B, k)
    index = (best[:, :, None] * chunk + columns).flatten(1)  # (B, k * C)
    if whole < width:  # the columns past the last whole chunk
        tail = columns[: width - whole] + whole
        index = torch.cat([index, tail.expand(index.shape[0], -1)], 1)
    top, position = scores.gather(1, index).topk(k, 1)
    return top, index.gather(1, position)


def explore_slots(share: float, width: int) -> list[int]:
    """The answer's columns (0-based, of ``width``) that exploration gives to new items: every ``1 / share``-th,
    so the first k columns of an answer hold ``floor(share * k)`` of them whatever the k a request asks."""
    if share <= 0:
        return []
    return [column for column in range(width) if int((column + 1) * share + 1e-9) > int(column * share + 1e-9)]


def explored_top(
    scores: torch.Tensor, width: int, new_items: torch.Tensor, slots: torch.Tensor, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top ``width`` of each row with ``count`` of its columns (``slots``) reserved for the best-scored new
    items: Personalize's exploration, one graph (no data-dependent shape).

    The other columns take the best of every other item in order. A row whose rules leave fewer new items than
    its slots fills the rest of them from the other items, so no answer holds a gap before its end.

    Args:
        scores: (B, V) scores, -inf where an item may not be answered.
        new_items: (n,) int64 vocabulary indices, the items that no training event holds (their columns alone
            are read for the reserved slots, not the whole row).
        slots: (width,) bool, the reserved columns (``explore_slots``); ``count`` of them are True.

    Returns:
        (B, width) scores and indices; the reserved columns' scores are the new items' own.
    """
    chosen_count = min(count, new_items.shape[0])  # fewer new items than slots: the rest are filled
    new_scores, position = scores.index_select(1, new_items).topk(chosen_count, dim=1)  # (B, chosen_count)
    new_scores = F.pad(new_scores, (0, count - chosen_count), value=float("-inf"))  # (B, count)
    new_indices = F.pad(new_items[position], (0, count - chosen_count), value=PAD_INDEX)
    found = new_scores > float("-inf")
    # the chosen new items leave the others' ranking; a slot without one is filled from it
    chosen = torch.where(found, new_indices, PAD_INDEX)  # an unfound one is any -inf item: leave the rest whole
    rest_scores, rest_indices = scores.scatter(1, chosen, float("-inf")).topk(width, dim=1)  # (B, width)
    reserved = F.pad(found, (0, width - count), value=False)  # (B, width): the j-th slot takes the j-th new item
    order = slots.long().cumsum(0) - 1  # (width,): which reserved slot each column is, -1 before the first
    taken = slots[None, :] & reserved.gather(1, order.clamp(min=0).expand_as(reserved))  # (B, width)
    from_new = taken.long().cumsum(1) - 1
    from_rest = (~taken).long().cumsum(1) - 1
    pick_new = lambda t: F.pad(t, (0, width - count)).gather(1, from_new.clamp(min=0))  # noqa: E731
    pick_rest = lambda t: t.gather(1, from_rest.clamp(min=0))  # noqa: E731
    return (
        torch.where(taken, pick_new(new_scores), pick_rest(rest_scores)),
        torch.where(taken, pick_new(new_indices), pick_rest(rest_indices)),
    )


@torch.jit.script_if_tracing
def _rule_scores_on_host(
    scores: torch.Tensor,
    masks: torch.Tensor,
    mask_of_row: torch.Tensor,
    excluded: torch.Tensor,
    included: torch.Tensor,
    known: torch.Tensor,
    popularity: torch.Tensor,
) -> torch.Tensor:
    """``TopKHead.scores``' rule step (``allowed_items``, then the select) for a graph that runs on the host:
    the work over batch x catalogue that the batch does not need is left out (the list to keep to where no row
    has one; popularity where every row has a known item). The same answer; a CPU's select and logical
    operations over every item are most of what a rule costs there."""
    allowed = _masked_rows(masks, mask_of_row, excluded)
    if bool((included[:, 0] != 0).any()):
        allowed = _drop_unlisted(allowed, included)
    if not bool(known.all()):
        scores = torch.where(known, scores, popularity)
    return torch.where(allowed, scores, float("-inf"))


class TopKHead(nn.Module):
    """Tokens (mask appended) in, top-k indices and scores out: the model step of the seed layout.

    The scores stay in the encoder's precision up to the top-k (a bf16 graph selects over half the bytes of
    float32, in half the radix passes: most of a large catalogue's time), and only the k chosen become
    float32. Rows without a known item answer the most popular items, a constant of the graph.
    """

    special: torch.Tensor
    new_items: torch.Tensor | None
    slot_mask: torch.Tensor
    popular_scores: torch.Tensor
    popular_indices: torch.Tensor
    popularity: torch.Tensor

    def __init__(
        self, encoder: Bert4Rec | SASRec | MultVAE, popularity: np.ndarray, max_k: int, explore_new: float = 0.0
    ):
        """explore_new: the share of the answer's columns reserved for the best-scored new items (items no
        training event holds, which a model with attributes ranks by them: ``explored_top``); 0: none."""
        super().__init__()
        encoder.prepare_inference()  # a serving graph's weights are final
        self.encoder = encoder
        self.k_limit = max_k  # the largest k a request may ask for
        self.max_k = min(max_k, encoder.cfg.num_items)  # the widest answer: a small catalogue has fewer items
        cfg = encoder.cfg
        special = torch.zeros(cfg.vocab_size)
        special[[PAD_INDEX, cfg.mask_index]] = float("-inf")  # added to every score: never recommended
        self.register_buffer("special", special, persistent=False)
        pop = torch.log1p(torch.as_tensor(popularity, dtype=torch.float32)) + special
        self.register_buffer("popularity", pop, persistent=False)  # (V,): the same, before a rule's mask
        self.explore_new = explore_new
        self.slots = explore_slots(explore_new, self.max_k)
        new_items = getattr(encoder, "untrained", None)
        if self.slots and (new_items is None or not bool(new_items.any())):
            raise ConfigError(
                f"explore_new={explore_new}: the run has no new items to explore (items that no training event "
                "holds, ranked by their attributes); train with --item-attributes on data with an item table"
            )
        slot_mask = torch.zeros(self.max_k, dtype=torch.bool)
        slot_mask[self.slots] = True
        new_list = new_items.nonzero()[:, 0] if self.slots and new_items is not None else None
        self.register_buffer("new_items", new_list, persistent=False)  # (n,) their indices
        self.register_buffer("slot_mask", slot_mask, persistent=False)
        # the answer to a history of no known item, explored as every other answer is
        popular_scores, popular_indices = (top[0] for top in self.top_k(pop[None], self.max_k))
        self.register_buffer("popular_scores", popular_scores, persistent=False)
        self.register_buffer("popular_indices", popular_indices, persistent=False)

    def top_k(self, scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The top ``k`` scores and indices of each row of (B, V) ``scores``, with exploration's columns where
        the graph explores (``explored_top``)."""
        count = sum(1 for column in self.slots if column < k)
        if not count or self.new_items is None:
            return scores.topk(k, dim=1)
        return explored_top(scores, k, self.new_items, self.slot_mask[:k], count)

    def scores(
        self,
        tokens: torch.Tensor,
        exclude_seen: torch.Tensor,
        allowed: torch.Tensor | None = None,
        host_rules: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """tokens: (B, L) with the mask token last; exclude_seen: (B,) bool; allowed: (B, V) bool, the items
        each row's rules let through (``allowed_items``), or None for every item; host_rules instead: the
        rules as ``allowed_items`` takes them, applied by a graph that runs on the host (``_rule_scores_on_host``).

        Returns:
            (B, V) scores in the encoder's precision, -inf for padding, the mask token, (where asked) the
            seen items and the items ``allowed`` keeps out. Without ``allowed``, rows without a known item take
            their answer from ``popular`` instead; with it, they are scored by popularity here, under the same
            rules.
        """
        scores = self.encoder(tokens)  # (B, V): the mask position only
        scores = scores + self.special.to(scores.dtype)
        if allowed is not None or host_rules is not None:
            known = _known(tokens)
            popularity = self.popularity.to(scores.dtype)
            if allowed is not None:
                scores = torch.where(allowed, torch.where(known, scores, popularity), float("-inf"))
            elif host_rules is not None:
                scores = _rule_scores_on_host(scores, *host_rules, known, popularity)
        seen = _seen(tokens, exclude_seen)
        return scores.scatter(1, seen, float("-inf"))

    def ruled_scores(
        self,
        tokens: torch.Tensor,
        exclude_seen: torch.Tensor,
        masks: torch.Tensor | None = None,
        mask_of_row: torch.Tensor | None = None,
        excluded: torch.Tensor | None = None,
        width: int = 0,
    ) -> torch.Tensor:
        """``scores`` under business rules, for one graph that serves every batch (a GPU's replays): the
        rules as ``allowed_items`` takes them, less the lists to keep to (``top_k_of_lists``, after the top k);
        without ``masks``, every item (a GPU's plain step: one pass over the scores besides the product, where
        ``scores`` makes three).

        A transformer's rules ride in its output layer's bias. Each mask becomes two bias rows, the layer's
        own bias and the popularity of rows without a known item, -inf where the mask keeps an item out; each
        row gathers its own and the product adds to it in place. Over batch x catalogue that is one gather
        besides the product, where ``allowed_items`` and its selects make seven passes (their bytes, not their
        arithmetic, are what a rule costs a GPU under load). In place, the product costs what the plain
        product with the rows added after it does at batch 1 and less at batch 64 (1M items, one H100: 0.290
        against 0.284 ms, 0.593 against 0.650; ``benchmarks/rules_overhead.py --profile``). The bias rows are
        made on every call, two a mask (a bank holds the hidden items' mask and one a stored rule). Excluded
        and seen items are set to -inf in one scatter. An encoder without that bias (Mult-VAE) takes the rules
        as ``scores`` does.

        Args:
            width: lay each row of scores over this many columns, -inf past the catalogue's V (a GPU's graph:
                a row stride in whole chunks of ``chunked_top_k``, which the matrix kernels align to); 0 or
                less than V: V.

        Returns:
            (B, max(width, V)) scores in the encoder's precision, as ``scores`` returns them under
            ``allowed_items``.
        """
        encoder = self.encoder
        if not isinstance(encoder, (Bert4Rec, SASRec)):
            if masks is None or mask_of_row is None or excluded is None:
                return self.scores(tokens, exclude_seen)
            return self.scores(tokens, exclude_seen, _masked_rows(masks, mask_of_row, excluded))
        known = _known(tokens)
        query = encoder.query(tokens)
        dtype = query.dtype
        bias = torch.stack([(encoder.item_bias() + self.special).to(dtype), self.popularity.to(dtype)])  # (2, V)
        items = encoder.cfg.vocab_size
        unknown = (~known[:, 0]).long()
        if masks is None or mask_of_row is None:  # every item: the known rows' bias row, or popularity's
            rows, row = bias, unknown
        else:  # (2R, V): known, then not
            rows = torch.where(masks[None], bias[:, None], float("-inf")).flatten(0, 1)
            row = unknown * masks.shape[0] + mask_of_row  # (B,): each row's bias row
        if width > items:
            rows = F.pad(rows, (0, width - items), value=float("-inf"))
        # whole rows copied by index_select: advanced indexing's gather took 0.31 of the graph's 1.52 ms at
        # batch 64 x 1M items on an H100 (benchmarks/output_layer_speed.py)
        scores = rows.index_select(0, row)
        encoder.add_output(scores, query * known.to(dtype))
        seen = _seen(tokens, exclude_seen)
        return scores.scatter_(1, seen if excluded is None else torch.cat([seen, excluded], 1), float("-inf"))

    def popular(
        self, tokens: torch.Tensor, top_scores: torch.Tensor, top_indices: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-k of ``scores`` with float32 scores, and the most popular items in the rows of ``tokens``
        without a known item (only the mask token); as wide as the top-k given."""
        known = _known(tokens)
        rank = torch.ones_like(top_indices).cumsum(1) - 1  # (B, K) 0..K-1 without a shape constant (ONNX edits K)
        return (
            torch.where(known, top_scores.float(), self.popular_scores[rank]),
            torch.where(known, top_indices, self.popular_indices[rank]),
        )

    def top(
        self, tokens: torch.Tensor, exclude_seen: torch.Tensor, k: int, allowed: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The top ``k`` (at most ``max_k``) scores (B, k) float32 and vocabulary indices (B, k) int64, best
        first; under ``allowed`` (B, V), only the items it lets through (fewer than k score -inf)."""
        if allowed is None:
            return self.popular(tokens, *self.top_k(self.scores(tokens, exclude_seen), k))
        top_scores, top_indices = self.top_k(self.scores(tokens, exclude_seen, allowed), k)
        return top_scores.float(), top_indices

    def forward(
        self, tokens: torch.Tensor, exclude_seen: torch.Tensor, allowed: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens: (B, L) with the mask token last; exclude_seen: (B,) bool; allowed: (B, V) bool or None.

        Returns:
            Top-k vocabulary indices (B, K) int64 and scores (B, K) float32, best first.
        """
        top_scores, top_indices = self.top(tokens, exclude_seen, self.max_k, allowed)
        return top_indices, top_scores


class SeedStep(nn.Module):
    """The seed layout's model step (the PoC's ``bert4rec`` on ``pytorch_libtorch``): tokens with the mask
    token last in, the top-k vocabulary indices and their scores out; seen items stay in, as the PoC had it."""

    def __init__(self, head: TopKHead, k: int):
        super().__init__()
        self.head = head
        self.k = min(k, head.max_k)

    def forward(self, input__0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keep_seen = torch.zeros_like(input__0[:, 0], dtype=torch.bool)
        top_scores, top_indices = self.head.top(input__0, keep_seen, self.k)
        return top_indices, top_scores


class InferenceGraph(nn.Module):
    """Item IDs in, top-k item IDs and scores out: the fused serving graph."""

    table: torch.Tensor
    lut: torch.Tensor | None
    index_to_id: torch.Tensor

    def __init__(
        self,
        encoder: Bert4Rec | SASRec | MultVAE,
        item_ids: np.ndarray,
        popularity: np.ndarray,
        max_k: int,
        explore_new: float = 0.0,
    ):
        """
        Args:
            encoder: a trained BERT4Rec, or a Mult-VAE (which reads the history as a bag of items and ignores
                the mask token).
            item_ids: (N,) sorted int64 IDs; 1..N where the predictor maps IDs itself (string IDs, or
                sparse integer IDs for backends without a search operator).
            popularity: (N + 2,) interaction counts by index, for histories with no known item.
            max_k: the most items a request can ask for.
            explore_new: the share of the answer reserved for new items (``TopKHead``).
        """
        super().__init__()
        self.head = TopKHead(encoder, popularity, max_k, explore_new)
        self.window = encoder.cfg.window
        self.mask_index = encoder.cfg.mask_index
        item_ids = np.asarray(item_ids, dtype=np.int64)
        table = torch.as_tensor(item_ids)
        self.register_buffer("table", table, persistent=False)
        lut = torch.as_tensor(lookup_table(item_ids)) if use_lookup_table(item_ids) else None
        self.register_buffer("lut", lut, persistent=False)  # None: search the table instead
        self.lut_last = 0 if lut is None else int(lut.shape[0]) - 1
        # index -> ID; -1 for padding and mask, which never reach the top k
        self.register_buffer(
            "index_to_id", torch.cat([table.new_full((1,), -1), table, table.new_full((1,), -1)]), persistent=False
        )

    def forward(
        self,
        item_ids: torch.Tensor,
        lengths: torch.Tensor,
        exclude_seen: torch.Tensor,
        masks: torch.Tensor,
        mask_of_row: torch.Tensor,
        excluded: torch.Tensor,
        included: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """item_ids: (B, L) int64, left-padded; lengths: (B,) int64; exclude_seen: (B,) bool; the business
        rules (``recserve.rules``) as ``allowed_items`` takes them: masks (R, V) bool, mask_of_row (B,) int64,
        excluded (B, E) and included (B, I) int64 vocabulary indices.

        Returns:
            Top-k item IDs (B, K) int64 and scores (B, K) float32, best first; K is ``max_k``. Where fewer
            than K items are allowed, the rest score -inf (their IDs are arbitrary).
        """
        if item_ids.shape[1] > self.window - 1:  # a shape test: exports bound the length and drop it
            item_ids = item_ids[:, -(self.window - 1) :]  # the most recent items the window holds
        width = item_ids.shape[1]
        column = torch.ones_like(item_ids[0]).cumsum(0) - 1  # (L,) 0..L-1, on the inputs' device
        valid = column[None, :] >= (width - lengths)[:, None]  # (B, L)
        indices = ids_to_indices(self.table, self.lut, item_ids, valid, self.lut_last)
        tokens = F.pad(indices, (0, 1), value=self.mask_index)  # (B, L + 1): the mask token last; L may be 0
        top_indices, top_scores = self.head(tokens, exclude_seen, allowed_items(masks, mask_of_row, excluded, included))
        return self.index_to_id[top_indices], top_scores


@torch.jit.script_if_tracing
def _top_k(scores: torch.Tensor, k: torch.Tensor, max_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top max(k) of each row (clamped to 1..max_k): a traced graph keeps the width data-dependent."""
    width = int(k.max().clamp(1, max_k).item())
    return scores.topk(width, dim=1)


class NativeGraph(nn.Module):
    """The serving graph behind the ``recommender`` contract for Triton's native backends (no Python).

    Native backends batch requests of one shape, so histories arrive padded to a fixed length: the most
    recent ``window - 1`` IDs, filled on the left with ``NATIVE_PAD_ID``, which the graph treats as empty.
    ``k`` and ``exclude_seen`` are per-request inputs of shape (1,). The answer is as wide as the largest k
    in the batch (``dynamic_k``) or ``max_k``; a row's columns past its own k, and every column of a row
    whose k is outside 1..max_k, hold ``NATIVE_PAD_ID`` and score -inf (a native model cannot fail one
    request of a batch).
    """

    chunk_columns: torch.Tensor | None

    def __init__(self, graph: InferenceGraph, dynamic_k: bool = True, chunk: int = 0):
        """
        Args:
            graph: the fused graph; its ID table must hold the real item IDs (``id_mapping`` "graph").
            dynamic_k: select the batch's largest k (TorchScript on CPUs: it reads k on the host); False
                selects ``max_k`` (TorchScript on GPUs), or leaves the width to a later edit of the exported
                graph (ONNX, ``recserve.export.onnx``).
            chunk: with ``dynamic_k`` False, select ``max_k`` through chunks of this many items
                (``chunked_top_k``: a GPU's graph, ``TOP_K_CHUNK``) where the catalogue holds ``max_k`` of
                them and no answer explores; 0: ``topk`` over the whole row.
        """
        super().__init__()
        self.max_k = graph.head.max_k
        self.k_limit = graph.head.k_limit  # k up to this is answered, with at most max_k items
        self.dynamic_k = dynamic_k
        items = graph.head.special.shape[0]
        chunked = chunk > 0 and not dynamic_k and not graph.head.slots and items // chunk >= self.max_k
        columns = torch.arange(chunk, device=graph.head.special.device) if chunked else None  # beside the graph
        self.register_buffer("chunk_columns", columns, persistent=False)
        # a transformer's rows of scores in whole chunks: no columns past the last one, and a row stride that
        # the GPU's matrix kernels align to (1M items + 2 is not a multiple of 8); Mult-VAE's as they come
        padded = isinstance(graph.head.encoder, (Bert4Rec, SASRec))
        self.width = (-(-items // chunk) * chunk if padded else items) if chunked else 0
        self.chunk = chunk
        self.last_index = items - 1
        if self.width > items:  # the item table in whole chunks too, in a copy: the caller's graph keeps its own
            graph = copy.deepcopy(graph)
            cast(Bert4Rec | SASRec, graph.head.encoder).pad_items(self.width)
        self.fused = graph  # not "graph": torch.export's modules have an attribute of that name
        self.train(graph.training)

    def forward(
        self, item_ids: torch.Tensor, k: torch.Tensor, exclude_seen: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """item_ids: (B, L) int64, left-padded with NATIVE_PAD_ID; k: (B, 1) int32; exclude_seen: (B, 1) bool.

        Returns:
            item IDs (B, K) int64, scores (B, K) float32 and unknown IDs (B, 1) int32 (history IDs that are
            neither padding nor in the catalogue).
        """
        tokens, unknown = self._tokens(item_ids)
        head = self.fused.head
        if self.chunk_columns is not None:  # a GPU's graph: the bias rows' one pass, rows in whole chunks
            scores = head.ruled_scores(tokens, exclude_seen[:, 0], width=self.width)
        else:
            scores = head.scores(tokens, exclude_seen[:, 0])
        top_scores, top_indices = head.popular(tokens, *self._top(scores, k))
        return (*self._answer(top_scores, top_indices, k), unknown)

    def ruled(
        self,
        item_ids: torch.Tensor,
        k: torch.Tensor,
        exclude_seen: torch.Tensor,
        masks: torch.Tensor,
        mask_of_row: torch.Tensor,
        excluded: torch.Tensor,
        included: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``forward`` under business rules (recserve's backend calls it; Triton's own backends only
        ``forward``): the rules as ``allowed_items`` takes them, vocabulary indices that the backend maps from
        IDs. Where fewer than k items are allowed, the rest of the row is padding (``NATIVE_PAD_ID``, -inf)."""
        tokens, unknown = self._tokens(item_ids)
        rules = (masks, mask_of_row, excluded, included)
        if self.dynamic_k:  # a graph for the host (it reads k there already): what the batch needs of the rules
            scores = self.fused.head.scores(tokens, exclude_seen[:, 0], host_rules=rules)
            top_scores, top_indices = self._top(scores, k)
        else:  # one graph for every batch (a GPU's replays): the rules' bytes over the catalogue kept few
            scores = self.fused.head.ruled_scores(tokens, exclude_seen[:, 0], masks, mask_of_row, excluded, self.width)
            top_scores, top_indices = top_k_of_lists(scores, *self._top(scores, k), included)
        top_scores = top_scores.float()
        return (*self._answer(top_scores, top_indices, k, top_scores > float("-inf")), unknown)

    def _tokens(self, item_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens (B, L + 1), the mask token last, and the count of unknown IDs (B, 1) int32."""
        g = self.fused
        valid = item_ids != NATIVE_PAD_ID
        indices = ids_to_indices(g.table, g.lut, item_ids, valid, g.lut_last)
        unknown = (valid & (indices == PAD_INDEX)).sum(1, keepdim=True).to(torch.int32)
        return F.pad(indices, (0, 1), value=g.mask_index), unknown

    def _top(self, scores: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.dynamic_k and not self.fused.head.slots:  # exploration's columns are laid out for max_k
            return _top_k(scores, k, self.max_k)
        if self.chunk_columns is not None:  # an index past the catalogue scores -inf: kept in range for the IDs
            top_scores, top_indices = chunked_top_k(scores, self.max_k, self.chunk_columns, self.width, self.chunk)
            return top_scores, top_indices.clamp_max(self.last_index)
        return self.fused.head.top_k(scores, self.max_k)

    def _answer(
        self, top_scores: torch.Tensor, top_indices: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The IDs and scores of each row's first k (``allowed`` ones), padding past them."""
        rank = torch.ones_like(top_scores).cumsum(1)  # 1..K without a shape constant (ONNX edits K)
        usable = (k >= 1) & (k <= self.k_limit)
        keep = (rank <= k) & usable
        if allowed is not None:
            keep = keep & allowed
        ids = torch.where(keep, self.fused.index_to_id[top_indices], torch.full_like(top_indices, NATIVE_PAD_ID))
        return ids, torch.where(keep, top_scores, torch.full_like(top_scores, float("-inf")))
