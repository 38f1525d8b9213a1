"""The transformer that BERT4Rec and SASRec share: item and position embeddings, pre-norm blocks, the
output layer tied to the item embeddings, and the one-query fast path that serving uses.

Sequences are left-padded and positions are counted from the right, so the last token always has position
``window - 1`` and a shorter input needs no padding up to the window. Attention is bidirectional
(BERT4Rec) or causal (SASRec); the last position attends to every real token either way, so the serving
fast path is the same for both.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from recserve.constants import PAD_INDEX
from recserve.errors import ConfigError
from recserve.models.attribute_codes import AttributeCodes
from recserve.models.output_table import MULTIPLE, quantize_rows, scaled_product

SINGLE_QUERY_WEIGHTS = ("query_w", "query_b", "out_w", "out_b")  # Block.freeze_single_query's buffers


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout``; on CPUs a uniform draw and a comparison, twice as fast there as its bernoulli_ draw
    (forward and backward of a (128, 100, 64) batch: 5.5 against 11.4 ms on 2 cores)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    return x * ((torch.rand_like(x) >= p) * (1.0 / (1.0 - p)))


class Dropout(nn.Dropout):
    """``nn.Dropout`` drawn by ``dropout`` (the same state dict: none)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """Scaled dot-product attention with dropout ``p`` on its weights. q, k, v: (B, nh, L, hd); keep: a
    boolean mask broadcast to (B, nh, L, L), or a float one added to the scores (-inf where not attended).
    Returns (B, nh, L, hd).

    PyTorch's kernel, except when training on CPUs, where its dropout takes its slow path (the weights
    written out, then bernoulli_): there the same steps with ``dropout``.
    """
    if keep.dtype != torch.bool:
        keep = keep.to(q.dtype)  # under autocast, the kernel takes an additive mask of the queries' type
    if p == 0.0 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p)
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, nh, L, L)
    scores = scores.masked_fill(~keep, float("-inf")) if keep.dtype == torch.bool else scores + keep
    return dropout(scores.softmax(-1), p, True) @ v


def distances(keep: torch.Tensor) -> torch.Tensor:
    """(L, L) |query position - key position| for a mask whose last dimension is L keys, on its device."""
    order = torch.ones_like(keep[0, 0, 0], dtype=torch.long).cumsum(0)  # (L,) 1..L
    return (order[:, None] - order[None, :]).abs()


class SwiGLU(nn.Module):
    """The gated feed-forward of LiGR and LLaMA: ``down(silu(gate x) * up x)``, without biases."""

    def __init__(self, width: int, inner: int):
        super().__init__()
        self.gate_up = nn.Linear(width, 2 * inner, bias=False)
        self.down = nn.Linear(inner, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, -1)
        return self.down(F.silu(gate) * up)


class RecurrentMixer(nn.Module):
    """A linear recurrent unit beside attention (SASRec's ``lru`` option): the LRU of Orvieto et al. (ICML
    2023), as LRURec (Yue et al., 2024) put it in sequential recommendation, each token a decaying, rotating
    sum of the tokens up to it. A diagonal complex recurrence ``z_t = lambda z_(t-1) + gamma B x_t``, read out
    as ``Re(C z_t)``, is a causal convolution along the sequence with the kernel ``lambda^d`` at distance d; in
    real numbers, per state channel, two (L, L) lower-triangular matrices (``lambda``'s powers' cosine and sine
    parts, scaled), applied as batched matrix products: operations that every export backend runs, with no
    scan and no complex type. Padding (left) is zeroed first, so it adds nothing, and a token's distances are
    counted back from it, so a left-padded input gives what the unpadded one gives.
    """

    def __init__(self, hidden: int, r_min: float = 0.8, r_max: float = 0.99, max_phase: float = math.pi / 10):
        super().__init__()
        self.into = nn.Linear(hidden, 2 * hidden, bias=False)  # B: the state's real and imaginary parts
        self.out = nn.Linear(2 * hidden, hidden)  # C's real and (negated) imaginary parts, side by side
        radius = torch.sqrt(torch.rand(hidden) * (r_max**2 - r_min**2) + r_min**2)  # |lambda|, uniform on a ring
        self.nu_log = nn.Parameter(torch.log(-torch.log(radius)))  # |lambda| = exp(-exp(nu_log))
        self.theta_log = nn.Parameter(torch.log(max_phase * torch.rand(hidden).clamp(min=1e-3)))  # arg lambda
        self.frozen: torch.Tensor | None
        self.register_buffer("frozen", None, persistent=False)  # ``freeze``'s matrices (serving), else none

    def _decay(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """log |lambda|, arg lambda and gamma (the input's scale that keeps the state's variance), (N,) each,
        in float32 whatever the model's type (powers up to the window in bf16 would drift)."""
        log_radius = -torch.exp(self.nu_log.float())
        return log_radius, torch.exp(self.theta_log.float()), torch.sqrt(1 - torch.exp(2 * log_radius))

    def _kernel(self, real: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """real: (B, L), for its length. Returns lambda^d times gamma, real and imaginary parts, at each distance
        d = 0..L-1: (N, L) each. The (L, L) matrices index into these, so the powers are taken N x L times a
        call, not N x L x L (a batch-1 forward at window 100 spent most of its time there)."""
        log_radius, angle, gamma = self._decay()
        d = torch.ones_like(real[0], dtype=torch.float32).cumsum(0)[None] - 1  # (1, L) 0..L-1 on real's device
        magnitude, phase = torch.exp(d * log_radius[:, None]) * gamma[:, None], d * angle[:, None]
        return (magnitude * torch.cos(phase)).to(dtype), (magnitude * torch.sin(phase)).to(dtype)

    def _matrices(self, real: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """real: (B, L). Returns the convolution's matrices, lambda^(t - s) times gamma at query t and key s <= t,
        real and imaginary parts: (N, L, L) each."""
        order = torch.ones_like(real[0], dtype=torch.long).cumsum(0)  # (L,) 1..L on real's device
        distance = order[:, None] - order[None, :]  # (L, L): query position minus key position
        causal = (distance >= 0).to(dtype)
        cos, sin = (k[:, distance.clamp(min=0)] * causal for k in self._kernel(real, dtype))
        return cos, sin

    def freeze(self, window: int) -> None:
        """Makes the matrices of a ``window``-long input once, for a model whose weights no longer change
        (serving), as one real (2W, 2W) matrix per state channel, ``[[cos, -sin], [sin, cos]]``: a forward
        is then one batched product that gives the state's real and imaginary parts together (two products,
        their halves and sums were a dozen small kernels a call at batch 1)."""
        with torch.no_grad():
            real = torch.ones(1, window, dtype=torch.bool, device=self.nu_log.device)
            cos, sin = self._matrices(real, torch.float32)  # (N, W, W) each
            self.frozen = torch.cat([torch.cat([cos, -sin], 2), torch.cat([sin, cos], 2)], 1)  # (N, 2W, 2W)

    def _frozen_blocks(self, length: int) -> torch.Tensor:
        """The frozen matrix of a ``length``-long input as its four blocks, (N, 2, L, 2, L): each block's
        top-left corner (the matrices are Toeplitz); a view where the input is the window's length."""
        assert self.frozen is not None
        window = self.frozen.shape[1] // 2
        return self.frozen.unflatten(1, (2, window)).unflatten(3, (2, window))[:, :, :length, :, :length]

    def _state_inputs(self, h: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """h: (B, L, H) the block's normalised input; real: (B, L) True at tokens. Returns B h, zero at
        padding, as (N, 2L, B): per state channel the real parts' rows over the positions, then the imaginary."""
        x = self.into(h) * real[..., None].to(h.dtype)  # (B, L, 2N)
        return x.unflatten(-1, (2, -1)).permute(3, 2, 1, 0).flatten(1, 2)

    def forward(self, h: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """h: (B, L, H); real: (B, L). Returns (B, L, H): at each position, the readout of its state."""
        inputs = self._state_inputs(h, real)  # (N, 2L, B)
        length = h.shape[1]
        if self.frozen is not None:
            states = self._frozen_blocks(length).flatten(3, 4).flatten(1, 2).to(h.dtype) @ inputs  # (N, 2L, B)
        else:
            cos, sin = self._matrices(real, h.dtype)  # (N, L, L) each
            a, b = inputs[:, :length], inputs[:, length:]
            states = torch.cat([cos @ a - sin @ b, sin @ a + cos @ b], 1)
        return self.out(states.unflatten(1, (2, length)).permute(3, 2, 1, 0).flatten(2, 3))  # (B, L, 2N) read out

    def forward_last(self, h: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """``forward`` at the last position only: (B, 1, H)."""
        inputs = self._state_inputs(h, real)  # (N, 2L, B)
        length = h.shape[1]
        if self.frozen is not None:  # the last position's rows, its real and its imaginary part: (N, 2, 2L)
            rows = self._frozen_blocks(length)[:, :, -1].flatten(2, 3).to(h.dtype)
        else:
            order = torch.ones_like(real[0], dtype=torch.long).cumsum(0)
            cos, sin = (k[:, order[-1] - order] for k in self._kernel(real, h.dtype))  # (N, L): the last row
            rows = torch.stack([torch.cat([cos, -sin], 1), torch.cat([sin, cos], 1)], 1)
        return self.out((rows @ inputs).permute(2, 1, 0).flatten(1, 2))[:, None]  # (B, 2N) read out


class Block(nn.Module):
    """Pre-norm transformer block: self-attention over the unpadded tokens, then a GELU feed-forward.

    With ``ligr`` (SASRec's option; the LiGR layer of LinkedIn's ranking transformer, eSASRec's block): each
    residual branch is scaled by a sigmoid gate of the block's input at that point, ``x + sigmoid(W x + b)
    * branch``, and the feed-forward is a SwiGLU. With ``lru`` (SASRec's): a ``RecurrentMixer`` of the same
    normalised input beside attention, its output added to attention's in the first residual branch.
    """

    def __init__(self, cfg):
        super().__init__()
        self.heads = cfg.heads
        self.dropout = cfg.dropout
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        ligr = getattr(cfg, "ligr", False)
        if ligr:
            self.ffn = SwiGLU(cfg.hidden, 4 * cfg.hidden)
            self.gates = nn.ModuleList(nn.Linear(cfg.hidden, cfg.hidden) for _ in range(2))
        else:
            self.ffn = nn.Sequential(
                nn.Linear(cfg.hidden, 4 * cfg.hidden), nn.GELU(), nn.Linear(4 * cfg.hidden, cfg.hidden)
            )
            self.gates = None
        self.drop = Dropout(cfg.dropout)
        self.mixer = RecurrentMixer(cfg.hidden) if getattr(cfg, "lru", False) else None
        # SASRec's options: a learned bias per head and distance (Transformer-XL and T5 style), and a span
        # beyond which nothing is attended (local attention); 0: every position
        self.span = getattr(cfg, "attention_span", 0)
        relative = getattr(cfg, "relative_positions", False)
        self.rel_bias = nn.Parameter(torch.zeros(cfg.heads, cfg.window)) if relative else None
        # a plain int: a traced graph would take the bias's shape as a host tensor, on no GPU
        self.farthest = cfg.window - 1

    def _positional(self, keep: torch.Tensor) -> torch.Tensor:
        """keep: (B, 1, 1 | L, L) bool. Returns it with the span applied, or, with relative positions, the
        additive mask (B, nh, L, L): the bias of each query-key distance, -inf where not attended."""
        if not self.span and self.rel_bias is None:
            return keep
        distance = distances(keep)  # (L, L)
        if self.span:
            keep = keep & (distance < self.span)
        if self.rel_bias is None:
            return keep
        bias = self.rel_bias[:, distance.clamp(max=self.farthest)]  # (nh, L, L)
        return torch.where(keep, bias, float("-inf"))

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        # unflatten instead of view(B, L, ...) keeps batch and length symbolic when traced
        return t.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # (B, nh, L, hd)

    def _residual(self, which: int, x: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        """x plus a residual branch (0: attention, 1: feed-forward), gated by x where the block has gates."""
        if self.gates is None:
            return x + branch
        return x + torch.sigmoid(self.gates[which](x)) * branch

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """x: (B, L, H); keep: (B, 1, 1 | L, L) True where a key may be attended. Returns (B, L, H)."""
        h = self.ln1(x)
        q, k, v = (self._heads(t) for t in self.qkv(h).chunk(3, -1))
        p = self.dropout if self.training else 0.0
        y = attention(q, k, v, self._positional(keep), p)  # (B, nh, L, hd)
        branch = self.proj(y.transpose(1, 2).flatten(2))
        if self.mixer is not None:
            branch = branch + self.mixer(h, keep[:, 0, -1])  # the last query's keys: every token
        x = self._residual(0, x, self.drop(branch))
        return self._residual(1, x, self.drop(self.ffn(self.ln2(x))))

    def forward_last(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The inference fast path: the block's output at the last position only.

        With one query, attention needs no keys or values per token. For head h with query
        q = Wq x + bq: q . (Wk t + bk) = (Wk^T Wq x + Wk^T bq) . t + q . bk for each normalised token t, and
        the constant q . bk cancels in the softmax; and Wo (Wv sum_l p_l t_l + bv) + bo, the projected
        output, is (Wo Wv) applied to the weighted sum of the tokens plus a constant, since the weights p
        sum to one. So two layers made of products of the weights (the query side and the output side)
        and two products with the tokens replace the 3 H x H projection of every token. The same
        function, to float rounding; exports fold the weight products into constants.

        x: (B, L, H); keep: (B, 1, 1, L). Returns the last position's output (B, 1, H).
        """
        h = self.ln1(x)  # (B, L, H)
        if not isinstance(self.qkv, nn.Linear):  # a quantized layer: its weights are not plain tensors
            return self._forward_last_projected(x, h, keep)
        frozen = tuple(getattr(self, name, None) for name in SINGLE_QUERY_WEIGHTS)
        weights = self._single_query_weights() if frozen[0] is None else cast(tuple[torch.Tensor, ...], frozen)
        query_w, query_b, out_w, out_b = weights
        query = F.linear(h[:, -1], query_w, query_b).unflatten(-1, (self.heads, -1))  # (B, nh, H)
        attended, bias = self._last_positional(keep)
        scores = query @ h.transpose(1, 2) + (0 if bias is None else bias.to(h.dtype))  # (B, nh, L)
        scores = scores.masked_fill(~attended, float("-inf"))
        mixed = scores.softmax(-1) @ h  # (B, nh, H): each head's weighted sum of the tokens
        x = self._residual(0, x[:, -1:], self._with_mixer(F.linear(mixed.flatten(1), out_w, out_b)[:, None], h, keep))
        return self._residual(1, x, self.ffn(self.ln2(x)))

    def _with_mixer(self, branch: torch.Tensor, h: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The last position's attention branch (B, 1, H) plus the recurrent mixer's, where the block has one."""
        return branch if self.mixer is None else branch + self.mixer.forward_last(h, keep[:, 0, -1])

    def _last_positional(self, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """keep: (B, 1, 1, L). Returns which keys the last query attends (B, 1, L), the span applied, and
        with relative positions the bias of each key's distance from it (nh, L)."""
        attended = keep[:, 0]  # (B, 1, L)
        if not self.span and self.rel_bias is None:
            return attended, None
        distance = distances(keep).select(0, -1)  # (L,): from the last position back
        if self.span:
            attended = attended & (distance < self.span)
        return attended, None if self.rel_bias is None else self.rel_bias[:, distance]

    def freeze_single_query(self) -> None:
        """Computes the one-query weights once, for a model whose weights no longer change (serving)."""
        with torch.no_grad():
            for name, value in zip(SINGLE_QUERY_WEIGHTS, self._single_query_weights()):
                self.register_buffer(name, value.detach().clone(), persistent=False)

    def _single_query_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The query side (nh H x H, with the attention scale) and the output side (H x nh H) of one query."""
        width = self.qkv.in_features
        w_q, w_k, w_v = (w.unflatten(0, (self.heads, -1)) for w in self.qkv.weight.chunk(3, 0))  # (nh, hd, H)
        b_q, _, b_v = self.qkv.bias.chunk(3)
        scale = (width // self.heads) ** -0.5
        query_w = (w_k.transpose(1, 2) @ w_q).flatten(0, 1) * scale  # (nh H, H): Wk_h^T Wq_h per head
        query_b = (w_k.transpose(1, 2) @ b_q.unflatten(0, (self.heads, -1))[..., None]).flatten() * scale
        w_o = self.proj.weight.unflatten(1, (self.heads, -1)).transpose(0, 1)  # (nh, H, hd): Wo's columns per head
        out_w = (w_o @ w_v).transpose(0, 1).flatten(1)  # (H, nh H): Wo_h Wv_h side by side
        out_b = self.proj.weight @ b_v + self.proj.bias
        return query_w, query_b, out_w, out_b

    def _forward_last_projected(self, x: torch.Tensor, h: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """``forward_last`` through the qkv layer itself, for layers that quantization swapped."""
        q, k, v = self.qkv(h).chunk(3, -1)
        q, k, v = self._heads(q[:, -1:]), self._heads(k), self._heads(v)  # (B, nh, 1 | L, hd)
        attended, bias = self._last_positional(keep)
        mask = attended[:, :, None] if bias is None else torch.where(attended, bias, float("-inf"))[:, :, None]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype) if bias is not None else mask)
        x = self._residual(0, x[:, -1:], self._with_mixer(self.proj(y.transpose(1, 2).flatten(2)), h, keep))
        return self._residual(1, x, self.ffn(self.ln2(x)))


class ItemAttributeEmbedding(nn.Module):
    """An item as its ID plus its attributes (``--item-attributes``): one table of attribute rows
    (``models.attribute_codes``), summed per item beside the item's own embedding.

    An item no training event holds (``trained`` False: new in the catalogue) is its attributes alone: its ID
    row and bias are never trained (the training loss leaves it out), so its vector is the attributes' sum
    and its bias the trained items' mean. ``ItemTransformer.fold_attributes`` writes both into the plain item
    table and bias for serving, so the served graph is the one every backend already runs.
    """

    codes: torch.Tensor
    trained: torch.Tensor

    def __init__(self, vocab_size: int, columns: int, rows: int, hidden: int, id_dropout: float = 0.0):
        super().__init__()
        self.id_dropout = id_dropout  # training: the share of items scored by their attributes alone, a step
        self.table = nn.Embedding(rows, hidden, padding_idx=0)
        self.register_buffer("codes", torch.zeros(vocab_size, columns, dtype=torch.long))  # (V, A)
        self.register_buffer("trained", torch.ones(vocab_size, dtype=torch.bool))  # (V,)

    def set_codes(self, codes: AttributeCodes, trained: np.ndarray) -> None:
        """codes: the catalogue's (``attribute_codes``); trained: (V,) bool, items with a training event
        (padding and the mask token count as trained: they keep their own rows)."""
        with torch.no_grad():
            self.codes.copy_(torch.as_tensor(codes.codes.T))
            self.trained.copy_(torch.as_tensor(trained))

    def vectors(self, own: torch.Tensor) -> torch.Tensor:
        """own: (V, H) the ID embeddings. Returns (V, H): each item's ID row (none for a new item) plus its
        attributes' rows."""
        attributes = F.embedding_bag(self.codes, self.table.weight, mode="sum", padding_idx=0)
        keep = self.trained
        if self.training and self.id_dropout > 0:  # some trained items taught as a new one is served
            dropped = torch.rand(keep.shape, device=keep.device) < self.id_dropout
            dropped[[0, -1]] = False  # padding and the mask token keep their rows
            keep = keep & ~dropped
        return torch.where(keep[:, None], own, 0.0) + attributes.to(own.dtype)

    def bias(self, own: torch.Tensor) -> torch.Tensor:
        """own: (V,) the output bias. Returns it with every new item's the trained items' mean."""
        trained = self.trained.clone()
        trained[[0, -1]] = False  # padding and the mask token: -inf in every answer anyway
        mean = (own * trained).sum() / trained.sum().clamp(min=1)
        return torch.where(self.trained, own, mean)


class ItemTransformer(nn.Module):
    """Embeddings, blocks and the tied output layer; subclasses choose the attention and the head.

    The config needs ``num_items``, ``window``, ``hidden``, ``layers``, ``heads`` and ``dropout``.
    """

    causal = False  # SASRec: each position attends to itself and the positions before it

    def __init__(self, cfg, head: nn.Module):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.item_emb = nn.Embedding(cfg.vocab_size, cfg.hidden, padding_idx=PAD_INDEX)
        self.pos_emb = nn.Embedding(cfg.window, cfg.hidden)
        self.emb_norm = nn.LayerNorm(cfg.hidden)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.final_norm = nn.LayerNorm(cfg.hidden)
        self.head = head  # applied before the tied projection
        self.out_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.output_rows: torch.Tensor | None  # the item table in float8 (``quantize_output``), or none
        self.output_scale: torch.Tensor | None
        self.register_buffer("output_rows", None, persistent=False)
        self.register_buffer("output_scale", None, persistent=False)
        self.table_rows = cfg.vocab_size  # the item table's rows: more after ``pad_items``
        columns = getattr(cfg, "attribute_columns", 0)
        self.attributes = (
            ItemAttributeEmbedding(cfg.vocab_size, columns, cfg.attribute_rows, cfg.hidden, cfg.id_dropout)
            if columns
            else None
        )
        self.apply(self._init)
        if self.attributes is not None:
            nn.init.zeros_(self.attributes.table.weight[0])  # "none": no attribute

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(module.weight, std=0.02, a=-0.04, b=0.04)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def _embed(self, tokens: torch.Tensor, table: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns the embedded tokens (B, L, H) and which keys the last position attends, (B, 1, 1, L). With
        attributes, ``table`` is ``item_vectors()`` made once by the caller (None: made here)."""
        # no tensor is made with an explicit device: a traced graph would keep that device as a constant, and
        # Triton's PyTorch backend runs one traced graph on every GPU
        length = tokens.shape[1]
        positions = self.pos_emb.weight[self.cfg.window - length :]  # (L, H): the last L positions
        if self.attributes is None:
            items = self.item_emb(tokens)
        else:
            items = F.embedding(tokens, self.item_vectors() if table is None else table)
        x = self.drop(self.emb_norm(items + positions))
        keep = tokens[:, :-1] != PAD_INDEX
        keep = torch.cat([keep, torch.ones_like(tokens[:, -1:], dtype=torch.bool)], 1)  # the last attends itself
        return x, keep[:, None, None, :]

    def _attention_mask(self, keep: torch.Tensor) -> torch.Tensor:
        """keep: (B, 1, 1, L). Returns the mask every position uses: (B, 1, 1, L), or (B, 1, L, L) if causal."""
        if not self.causal:
            return keep
        order = torch.ones_like(keep[0, 0, 0], dtype=torch.long).cumsum(0)  # (L,) 1..L on keep's device
        earlier = order[None, :] <= order[:, None]  # (L, L): key position <= query position
        return (keep & earlier) | (order[None, :] == order[:, None])  # padding queries attend themselves

    def encode(self, tokens: torch.Tensor, table: torch.Tensor | None = None) -> torch.Tensor:
        """tokens: (B, L) indices, left-padded, L <= window; table: ``item_vectors()`` where the caller has made
        it already (a training step scores against the same table). Returns hidden states (B, L, H)."""
        x, keep = self._embed(tokens, table)
        mask = self._attention_mask(keep)
        for block in self.blocks:
            x = block(x, mask)
        return self.final_norm(x)

    def encode_last(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, L). Returns the last position's hidden state (B, H), computing no other output."""
        x, keep = self._embed(tokens)
        mask = self._attention_mask(keep)
        for block in self.blocks[:-1]:
            x = block(x, mask)
        last = cast(Block, self.blocks[-1])
        return self.final_norm(last.forward_last(x, keep)[:, 0])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (..., H). Returns scores over the whole vocabulary (..., N + 2)."""
        return self.tied_output(self.head(hidden))

    def tied_output(self, query: torch.Tensor, with_bias: bool = True) -> torch.Tensor:
        """query: (..., H), after the head. Returns the output layer's scores (..., N + 2): the product with
        the item embeddings (their float8 copy after ``quantize_output``: query (B, H) only), plus the output
        bias unless ``with_bias`` is False."""
        rows, scale = self.output_rows, self.output_scale
        if rows is None or scale is None:
            product = query @ self.item_vectors().T
        else:
            product = scaled_product(query, rows, scale)[:, : self.cfg.vocab_size]
        return product + self.item_bias() if with_bias else product

    def add_output(self, scores: torch.Tensor, query: torch.Tensor) -> None:
        """Adds to ``scores`` (B, W) the output layer's product with ``query`` (B, H), its bias left out, over the
        first columns, one an item of the table (W at least its rows: a serving graph's rows may run past the
        catalogue): in place, in one matrix kernel where the table is in the query's precision."""
        if self.output_rows is None:
            scores[:, : self.table_rows].addmm_(query, self.item_vectors().T)
        else:
            scores[:, : self.cfg.vocab_size].add_(self.tied_output(query, with_bias=False))

    def pad_items(self, width: int) -> None:
        """The item table grown to ``width`` rows of zeros, for a serving graph whose rows of scores are that wide
        (``serving_graph.NativeGraph`` on a GPU): the output layer's product then spans whole rows, a shape the
        GPU's matrix kernels align to (1M items on an H100: 0.19 against 0.29 ms at batch 1, 0.33 against 0.40 at
        batch 64; ``benchmarks/output_layer_speed.py``). No input reaches the rows past the catalogue; the 8-bit
        copy (``quantize_output``) keeps its own rows. After ``prepare_inference``."""
        weight = self.item_emb.weight
        if self.attributes is not None or width < weight.shape[0]:
            raise ConfigError(
                f"pad_items({width}): pads a plain table (after prepare_inference) of at most {width} rows; this one "
                f"has {weight.shape[0]} rows{' and attribute rows' if self.attributes is not None else ''}"
            )
        self.item_emb.weight = nn.Parameter(F.pad(weight.detach(), (0, 0, 0, width - weight.shape[0])), False)
        self.table_rows = width

    def quantize_output(self) -> None:
        """Scores against a float8 e4m3 copy of the item table from now on (``recserve.models.output_table``):
        half a bf16 table's bytes a call; the inputs still embed from the table itself. For serving graphs, after
        ``prepare_inference`` and after any cast of the model (a cast would cast the copy too)."""
        if self.cfg.hidden % MULTIPLE:
            raise ConfigError(
                f"an 8-bit output layer needs a hidden width in multiples of {MULTIPLE}, not {self.cfg.hidden}"
            )
        rows, scale = quantize_rows(self.item_vectors().detach(), MULTIPLE)
        self.register_buffer("output_rows", rows, persistent=False)
        self.register_buffer("output_scale", scale.T.contiguous(), persistent=False)  # (1, V'): _scaled_mm's form

    def item_vectors(self) -> torch.Tensor:
        """(V, H): the item table that inputs embed and the output layer scores against; with attributes
        (``ItemAttributeEmbedding``), each item's ID row plus its attributes' rows."""
        own = self.item_emb.weight
        return own if self.attributes is None else self.attributes.vectors(own)

    def item_bias(self) -> torch.Tensor:
        """(V,): the output layer's bias; with attributes, a new item's the trained items' mean."""
        return self.out_bias if self.attributes is None else self.attributes.bias(self.out_bias)

    def fold_attributes(self) -> None:
        """Writes the attributes into the plain item table and bias (``item_vectors``, ``item_bias``) and drops
        them: the same scores from a model of the plain shape, which every export backend serves."""
        if self.attributes is None:
            return
        with torch.no_grad():
            vectors, bias = self.item_vectors().clone(), self.item_bias().clone()
            self.item_emb.weight.copy_(vectors)
            self.out_bias.copy_(bias)
        # what serving may explore; padding and the mask token count as trained (set_codes), so never here
        self.register_buffer("untrained", ~self.attributes.trained, persistent=False)
        self.attributes = None
        self.cfg = replace(self.cfg, attribute_columns=0, attribute_rows=0)

    def query(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, L), the serving graph's input. Returns what the tied output layer scores, (B, H): the
        scores of ``forward`` are ``query @ item_emb.weight.T + out_bias``."""
        raise NotImplementedError

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, L), the serving graph's input. Returns the next item's scores (B, N + 2): the inference
        fast path."""
        return self.tied_output(self.query(tokens))

    def prepare_inference(self) -> None:
        """Precomputes what serving reuses on every call; the weights must not change afterwards."""
        self.fold_attributes()
        for block in self.blocks:  # the last one's mixer reads one row of them
            if cast(Block, block).mixer is not None:
                cast(RecurrentMixer, cast(Block, block).mixer).freeze(self.cfg.window)
        last = cast(Block, self.blocks[-1])
        if isinstance(last.qkv, nn.Linear):
            last.freeze_single_query()
