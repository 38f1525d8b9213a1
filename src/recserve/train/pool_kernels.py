"""The sampled loss's log-sum-exp over its pool as Triton kernels on a GPU: each block of positions against
the pool tile by tile, the left-out items masked and the log-sum-exp kept online (as flash attention keeps
its softmax), so that no (positions x pool) logit is ever written to memory. The backward pass makes the
logits again, tile by tile, in two kernels: one for the queries' gradient (a block of positions against
the whole pool), one for the pool vectors' and the bias's (a block of the pool against a share of the
positions, the shares summed afterwards in a fixed order: no atomics, so a step's gradients repeat exactly).

The products are 16-bit (the autocast dtype) with float32 sums, as the chunked path's; the bias is added in
float32. The masks are the chunked path's (``losses._block_logits``): position c leaves out pool item s where
``seen[rows[c], s] <= limit[c]`` or the item is c's own target; an item whose bias is -inf (padding, the mask
token) is never counted.

Used by ``losses.pool_logsumexp`` under a 16-bit autocast on a GPU where Triton imports; elsewhere its
chunked blocks run as before. The kernels are PyTorch custom operators, so a compiled step calls them as
they are and a CUDA graph captures their launches.
"""

from __future__ import annotations

import torch

try:  # Triton ships with PyTorch's CUDA builds; a CPU install has none
    import triton  # type: ignore[import-not-found, unused-ignore]
    import triton.language as tl  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - the CPU test machines have no Triton
    triton = None

# (positions a block, pool items a tile, warps, pipeline depth) by the hidden width's power of two
CONFIGS = {16: (128, 64, 4, 3), 32: (128, 64, 4, 3), 64: (128, 64, 4, 3), 128: (128, 64, 8, 2), 256: (64, 64, 8, 2)}
MAX_HIDDEN = 256
PROGRAMS_PER_SM = 4  # the pool gradient's grid: about this many programs a multiprocessor
PRODUCT_DTYPES = (torch.bfloat16, torch.float16)


class PoolKernels:
    """Whether the kernels run where they can (False: the chunked blocks everywhere, for comparison)."""

    enabled = True


def usable(query: torch.Tensor, dtype: torch.dtype | None) -> bool:
    """True where ``pool_logsumexp`` runs as these kernels: a CUDA tensor, Triton importable, a 16-bit
    product dtype (autocast's) and a hidden width up to ``MAX_HIDDEN``."""
    return (
        PoolKernels.enabled
        and triton is not None
        and query.device.type == "cuda"
        and dtype in PRODUCT_DTYPES
        and query.shape[-1] <= MAX_HIDDEN
    )


def _config(hidden: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_H, positions a block, pool items a tile, warps, stages) for ``hidden``."""
    block_h = max(16, triton.next_power_of_2(hidden))
    return (block_h, *CONFIGS[block_h])


if triton is not None:

    @triton.jit
    def _positions(q_ptr, rows_ptr, limit_ptr, targets_ptr, pos, ok, ks, k_ok, q_stride):
        """A block's queries (BC, BH), sample rows, limits and targets (both int32: a tile's compares in 32 bits)."""
        q = tl.load(q_ptr + pos[:, None] * q_stride + ks[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0)
        sample = tl.load(rows_ptr + pos, mask=ok, other=0)
        limit = tl.load(limit_ptr + pos, mask=ok, other=-1).to(tl.int32)
        target = tl.load(targets_ptr + pos, mask=ok, other=-1).to(tl.int32)
        return q, sample, limit, target

    @triton.jit
    def _pool_tile(v_ptr, bias_ptr, pool_ptr, cols, col_ok, ks, k_ok, v_stride):
        """A tile's pool vectors (BS, BH), its bias (-inf past the pool) and items (int32)."""
        v = tl.load(v_ptr + cols[:, None] * v_stride + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        bias = tl.load(bias_ptr + cols, mask=col_ok, other=float("-inf"))
        item = tl.load(pool_ptr + cols, mask=col_ok, other=-1).to(tl.int32)
        return v, bias, item

    @triton.jit
    def _logits(q, v, bias, item, seen_ptr, seen_stride, sample, limit, target, ok, cols, col_ok):
        """A tile's logits (BC, BS) float32, the bias added: -inf where the position leaves the item out (seen
        up to its limit, or its own target) and past the pool."""
        seen = tl.load(
            seen_ptr + sample[:, None] * seen_stride + cols[None, :], mask=ok[:, None] & col_ok[None, :], other=32767
        )
        drop = (seen.to(tl.int32) <= limit[:, None]) | (item[None, :] == target[:, None])
        return tl.where(drop, float("-inf"), tl.dot(q, tl.trans(v)) + bias[None, :])

    @triton.jit
    def _lse_kernel(
        q_ptr,
        v_ptr,
        bias_ptr,
        pool_ptr,
        targets_ptr,
        seen_ptr,
        rows_ptr,
        limit_ptr,
        lse_ptr,
        positions,
        pool_size,
        hidden,
        q_stride,
        v_stride,
        seen_stride,
        BLOCK_C: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        """Program m: the log-sum-exp (float32, -inf where nothing is left) of positions ``m * BLOCK_C`` on."""
        pos = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
        ok = pos < positions
        ks = tl.arange(0, BLOCK_H)
        k_ok = ks < hidden
        q, sample, limit, target = _positions(q_ptr, rows_ptr, limit_ptr, targets_ptr, pos, ok, ks, k_ok, q_stride)
        top = tl.full((BLOCK_C,), float("-inf"), dtype=tl.float32)
        total = tl.zeros((BLOCK_C,), dtype=tl.float32)
        for start in range(0, pool_size, BLOCK_S):
            cols = start + tl.arange(0, BLOCK_S)
            col_ok = cols < pool_size
            v, bias, item = _pool_tile(v_ptr, bias_ptr, pool_ptr, cols, col_ok, ks, k_ok, v_stride)
            logits = _logits(q, v, bias, item, seen_ptr, seen_stride, sample, limit, target, ok, cols, col_ok)
            new_top = tl.maximum(top, tl.max(logits, 1))
            shift = tl.where(new_top == float("-inf"), 0.0, new_top)  # a row with nothing yet stays at 0
            total = total * tl.exp(top - shift) + tl.sum(tl.exp(logits - shift[:, None]), 1)
            top = new_top
        lse = tl.where(total > 0, top + tl.log(total), float("-inf"))
        tl.store(lse_ptr + pos, lse, mask=ok)

    @triton.jit
    def _weights(logits, lse, grad):
        """d loss / d logits (BC, BS) float32: the softmax over the kept items times the upstream gradient."""
        finite = lse > float("-inf")
        scale = tl.where(finite, grad, 0.0)
        return tl.exp(logits - tl.where(finite, lse, 0.0)[:, None]) * scale[:, None]

    @triton.jit
    def _grad_query_kernel(
        q_ptr,
        v_ptr,
        bias_ptr,
        pool_ptr,
        targets_ptr,
        seen_ptr,
        rows_ptr,
        limit_ptr,
        lse_ptr,
        grad_ptr,
        grad_q_ptr,
        positions,
        pool_size,
        hidden,
        q_stride,
        v_stride,
        seen_stride,
        BLOCK_C: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_H: tl.constexpr,
        DOT: tl.constexpr,
    ):
        """Program m: the queries' gradient (float32) of positions ``m * BLOCK_C`` on."""
        pos = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
        ok = pos < positions
        ks = tl.arange(0, BLOCK_H)
        k_ok = ks < hidden
        q, sample, limit, target = _positions(q_ptr, rows_ptr, limit_ptr, targets_ptr, pos, ok, ks, k_ok, q_stride)
        lse = tl.load(lse_ptr + pos, mask=ok, other=float("-inf"))
        grad = tl.load(grad_ptr + pos, mask=ok, other=0.0)
        acc = tl.zeros((BLOCK_C, BLOCK_H), dtype=tl.float32)
        for start in range(0, pool_size, BLOCK_S):
            cols = start + tl.arange(0, BLOCK_S)
            col_ok = cols < pool_size
            v, bias, item = _pool_tile(v_ptr, bias_ptr, pool_ptr, cols, col_ok, ks, k_ok, v_stride)
            logits = _logits(q, v, bias, item, seen_ptr, seen_stride, sample, limit, target, ok, cols, col_ok)
            acc = tl.dot(_weights(logits, lse, grad).to(DOT), v, acc)
        tl.store(grad_q_ptr + pos[:, None] * hidden + ks[None, :], acc, mask=ok[:, None] & k_ok[None, :])

    @triton.jit
    def _grad_pool_kernel(
        q_ptr,
        v_ptr,
        bias_ptr,
        pool_ptr,
        targets_ptr,
        seen_ptr,
        rows_ptr,
        limit_ptr,
        lse_ptr,
        grad_ptr,
        grad_v_ptr,
        grad_bias_ptr,
        positions,
        pool_size,
        hidden,
        q_stride,
        v_stride,
        seen_stride,
        positions_per_program,
        BLOCK_C: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_H: tl.constexpr,
        DOT: tl.constexpr,
    ):
        """Program (n, p): the gradient (float32) of pool items ``n * BLOCK_S`` on, over share p of the
        positions, written to share p's own rows of the (shares, S, H) and (shares, S) outputs."""
        cols = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
        col_ok = cols < pool_size
        ks = tl.arange(0, BLOCK_H)
        k_ok = ks < hidden
        v, bias, item = _pool_tile(v_ptr, bias_ptr, pool_ptr, cols, col_ok, ks, k_ok, v_stride)
        acc = tl.zeros((BLOCK_S, BLOCK_H), dtype=tl.float32)
        acc_bias = tl.zeros((BLOCK_S,), dtype=tl.float32)
        first = tl.program_id(1) * positions_per_program
        for start in range(first, tl.minimum(first + positions_per_program, positions), BLOCK_C):
            pos = start + tl.arange(0, BLOCK_C)
            ok = pos < positions
            q, sample, limit, target = _positions(q_ptr, rows_ptr, limit_ptr, targets_ptr, pos, ok, ks, k_ok, q_stride)
            lse = tl.load(lse_ptr + pos, mask=ok, other=float("-inf"))
            grad = tl.load(grad_ptr + pos, mask=ok, other=0.0)
            logits = _logits(q, v, bias, item, seen_ptr, seen_stride, sample, limit, target, ok, cols, col_ok)
            weights = _weights(logits, lse, grad)
            acc = tl.dot(tl.trans(weights.to(DOT)), q, acc)
            acc_bias += tl.sum(weights, 0)
        share = tl.program_id(1) * pool_size
        out = grad_v_ptr + (share + cols)[:, None] * hidden + ks[None, :]
        tl.store(out, acc, mask=col_ok[:, None] & k_ok[None, :])
        tl.store(grad_bias_ptr + share + cols, acc_bias, mask=col_ok)


def _common(query, vectors, bias, pool, targets, seen, rows, limit, dot: torch.dtype):
    """The kernels' first arguments, shared by all three, each tensor contiguous, the products' operands in
    their dtype (made once here, not in every tile); and the sizes they take."""
    q, v, seen = query.to(dot).contiguous(), vectors.to(dot).contiguous(), seen.contiguous()
    others = (bias.float(), pool, targets, seen, rows, limit)
    tensors = (q, v, *(t.contiguous() for t in others))
    sizes = (q.shape[0], v.shape[0], q.shape[1], q.stride(0), v.stride(0), seen.stride(0))
    return tensors, sizes


@torch.library.custom_op("recserve::pool_logsumexp", mutates_args=())
def pool_logsumexp(
    query: torch.Tensor,
    vectors: torch.Tensor,
    bias: torch.Tensor,
    pool: torch.Tensor,
    targets: torch.Tensor,
    seen: torch.Tensor,
    rows: torch.Tensor,
    limit: torch.Tensor,
    dot: torch.dtype,
) -> torch.Tensor:
    """(C,) float32 log-sum-exp of each position's pool logits, as ``losses.pool_logsumexp`` gives it.

    Args:
        query: (C, H) and vectors: (S, H), float32 or 16-bit; bias: (S,); pool: (S,) items; targets: (C,);
        seen: (B, S) int16; rows: (C,) each position's row of ``seen``; limit: (C,) int16; dot: the products'
        dtype, one of ``PRODUCT_DTYPES``.
    """
    tensors, (positions, pool_size, hidden, q_stride, v_stride, seen_stride) = _common(
        query, vectors, bias, pool, targets, seen, rows, limit, dot
    )
    block_h, block_c, block_s, warps, stages = _config(hidden)
    lse = torch.empty(positions, dtype=torch.float32, device=query.device)
    if positions:
        _lse_kernel[(triton.cdiv(positions, block_c),)](
            *tensors, lse, positions, pool_size, hidden, q_stride, v_stride, seen_stride,
            BLOCK_C=block_c, BLOCK_S=block_s, BLOCK_H=block_h, num_warps=warps, num_stages=stages,
        )  # fmt: skip
    return lse


@pool_logsumexp.register_fake
def _(query, vectors, bias, pool, targets, seen, rows, limit, dot):
    return query.new_empty(query.shape[0], dtype=torch.float32)


@torch.library.custom_op("recserve::pool_logsumexp_grads", mutates_args=())
def pool_logsumexp_grads(
    query: torch.Tensor,
    vectors: torch.Tensor,
    bias: torch.Tensor,
    pool: torch.Tensor,
    targets: torch.Tensor,
    seen: torch.Tensor,
    rows: torch.Tensor,
    limit: torch.Tensor,
    lse: torch.Tensor,
    grad: torch.Tensor,
    dot: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of ``pool_logsumexp`` for the query, the vectors and the bias, in their dtypes."""
    tensors, (positions, pool_size, hidden, q_stride, v_stride, seen_stride) = _common(
        query, vectors, bias, pool, targets, seen, rows, limit, dot
    )
    block_h, block_c, block_s, warps, stages = _config(hidden)
    lse, grad = lse.contiguous(), grad.float().contiguous()
    grad_q = torch.zeros(positions, hidden, dtype=torch.float32, device=query.device)
    pool_blocks = triton.cdiv(pool_size, block_s)
    sms = torch.cuda.get_device_properties(query.device).multi_processor_count
    shares = max(1, min(triton.cdiv(positions, block_c), triton.cdiv(PROGRAMS_PER_SM * sms, pool_blocks)))
    per_share = triton.cdiv(triton.cdiv(max(positions, 1), shares), block_c) * block_c
    shares = triton.cdiv(max(positions, 1), per_share)
    grad_v = torch.zeros(shares, pool_size, hidden, dtype=torch.float32, device=query.device)
    grad_bias = torch.zeros(shares, pool_size, dtype=torch.float32, device=query.device)
    if positions and pool_size:
        meta = dict(
            BLOCK_C=block_c, BLOCK_S=block_s, BLOCK_H=block_h, DOT=_dot(dot), num_warps=warps, num_stages=stages
        )
        _grad_query_kernel[(triton.cdiv(positions, block_c),)](
            *tensors, lse, grad, grad_q, positions, pool_size, hidden, q_stride, v_stride, seen_stride, **meta
        )
        _grad_pool_kernel[(pool_blocks, shares)](
            *tensors, lse, grad, grad_v, grad_bias, positions, pool_size, hidden, q_stride, v_stride,
            seen_stride, per_share, **meta,
        )  # fmt: skip
    return grad_q.to(query.dtype), grad_v.sum(0).to(vectors.dtype), grad_bias.sum(0).to(bias.dtype)


@pool_logsumexp_grads.register_fake
def _(query, vectors, bias, pool, targets, seen, rows, limit, lse, grad, dot):
    return torch.empty_like(query), torch.empty_like(vectors), torch.empty_like(bias)


def _dot(dtype: torch.dtype):
    return tl.bfloat16 if dtype == torch.bfloat16 else tl.float16


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs[:8], output)
    ctx.dot = inputs[8]


def _backward(ctx, grad):
    query, vectors, bias, pool, targets, seen, rows, limit, lse = ctx.saved_tensors
    grads = pool_logsumexp_grads(query, vectors, bias, pool, targets, seen, rows, limit, lse, grad, ctx.dot)
    return (*grads, None, None, None, None, None, None)


pool_logsumexp.register_autograd(_backward, setup_context=_setup_context)
