"""The sampled loss on a GPU (run on a GPU machine; skipped elsewhere): its Triton kernels and its
torch.compile'd blocks give the losses and gradients of the plain blocks under bf16 autocast, as training
runs them.

It needs nothing of the serving stack: on a GPU machine without tritonclient, run it with
``python -m pytest --noconftest tests/gpu/test_sampled_loss_gpu.py``.
"""

import numpy as np
import pytest
import torch

import recserve.train.losses as losses
from recserve.train.fused import GpuFused
from recserve.train.losses import CatalogueLoss
from recserve.train.pool_kernels import PoolKernels
from recserve.train.train_config import LossSettings

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _step(
    compiled: bool, monkeypatch, bf16: bool = True, no_sync: bool = False, kernels: bool = False
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One sampled loss's forward and backward; ``no_sync``: with any host sync of the call an error;
    ``kernels``: the pool's Triton kernels (else its blocks, compiled or not)."""
    monkeypatch.setattr(GpuFused, "enabled", compiled)
    monkeypatch.setattr(PoolKernels, "enabled", kernels)
    gen = torch.Generator("cuda").manual_seed(0)
    items, positions, rows, window = 200_000, 6_000, 128, 100
    query = torch.randn(positions, 64, device="cuda", generator=gen).requires_grad_()
    table = (torch.randn(items + 2, 64, device="cuda", generator=gen) * 0.1).requires_grad_()
    bias = torch.zeros(items + 2, device="cuda", requires_grad=True)
    targets = torch.randint(1, items + 1, (positions,), device="cuda", generator=gen)
    exclude = torch.randint(0, items + 1, (rows, window), device="cuda", generator=gen)
    exclude[:, :50] = targets[:50]  # pool items (the in-batch targets) in every row's history
    row_of = torch.arange(positions, device="cuda") * rows // positions
    upto = torch.randint(0, window, (positions,), device="cuda", generator=gen)
    loss = CatalogueLoss(LossSettings("sampled-uniform", negatives=4096), np.ones(items + 2), items + 1, "cuda")
    drawn = loss.draw(torch.Generator("cuda").manual_seed(1))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error" if no_sync else "default")
    try:
        with torch.autocast("cuda", torch.bfloat16, enabled=bf16):
            value = loss(query, table, bias, targets, exclude, row_of, drawn, upto)
        value.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return value.detach(), [t.grad for t in (query, table, bias)]


def _errors(grads, exact) -> list[float]:
    """Each gradient's distance from its float32 counterpart, relative to that one's norm."""
    return [float((g.float() - e).norm() / e.norm()) for g, e in zip(grads, exact)]


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "compiled-blocks"])
def test_a_sampled_loss_step_never_waits_for_the_gpu(monkeypatch, kernels):
    """Forward and backward send nothing from the GPU to the host, so the host queues the next step's
    kernels while these run (``torch.unique``'s count of distinct pool items once made every step wait)."""
    _step(True, monkeypatch, kernels=kernels)  # compiled once first (compiling reads the GPU)
    _step(True, monkeypatch, no_sync=True, kernels=kernels)


def _assert_as_exact_as_the_plain_blocks(monkeypatch, label: str, loss, grads) -> None:
    """``loss`` and ``grads`` (a ``_step``'s) against the float32 computation: the loss within 1e-2, each
    gradient no farther from it than twice the plain bf16 blocks' distance (plus 1e-3)."""
    exact_loss, exact_grads = _step(False, monkeypatch, bf16=False)
    _, plain_grads = _step(False, monkeypatch)
    torch.testing.assert_close(loss, exact_loss, rtol=1e-2, atol=1e-2)
    errors, plain_errors = _errors(grads, exact_grads), _errors(plain_grads, exact_grads)
    for name, error, plain in zip(("query", "table", "bias"), errors, plain_errors):
        print(f"{name}: {label} {error:.4f}, plain {plain:.4f} relative error")
        assert error <= 2 * plain + 1e-3, name


def test_compiled_blocks_are_as_exact_as_the_plain_blocks(monkeypatch, caplog):
    """Under bf16 autocast, both against the float32 computation: the compiled blocks no farther from it
    than twice the plain ones' distance. On one H200: query 0.0006 against 0.0004, table 0.0030 against
    0.0018, bias 0.0347 against 0.0215 (the relative error of each gradient)."""
    compiled_loss, compiled_grads = _step(True, monkeypatch)
    assert losses._fused_forward.compiled and losses._fused_weights.compiled and "runs uncompiled" not in caplog.text, (
        "the compiled blocks did not run"
    )
    _assert_as_exact_as_the_plain_blocks(monkeypatch, "compiled", compiled_loss, compiled_grads)


def test_the_pool_kernels_are_as_exact_as_the_plain_blocks(monkeypatch):
    """The Triton kernels (no logit in memory) against the float32 computation: no farther from it than
    twice the plain bf16 blocks' distance."""
    _assert_as_exact_as_the_plain_blocks(monkeypatch, "kernels", *_step(False, monkeypatch, kernels=True))


def test_the_pool_kernels_repeat_bit_for_bit(monkeypatch):
    """The same inputs twice: the same log-sum-exp and gradients to the bit (the pool's gradient is summed
    over shares in a fixed order, no atomics)."""
    monkeypatch.setattr(PoolKernels, "enabled", True)
    gen = torch.Generator("cuda").manual_seed(5)
    positions, samples, pool_size, hidden = 20_000, 200, 8_192, 64
    pool = torch.randint(2, 100_000, (pool_size,), device="cuda", generator=gen)
    history = pool[torch.randint(0, pool_size, (samples, 100), device="cuda", generator=gen)]
    fixed = {
        "seen": losses.first_columns(history, pool),
        "rows": torch.arange(positions, device="cuda") * samples // positions,
        "limit": (torch.arange(positions, device="cuda") % 100).to(torch.int16),
    }
    leaves = (
        torch.randn(positions, hidden, device="cuda", generator=gen),
        torch.randn(pool_size, hidden, device="cuda", generator=gen) * 0.2,
        torch.randn(pool_size, device="cuda", generator=gen),
    )
    targets = torch.randint(2, 100_000, (positions,), device="cuda", generator=gen)

    def run():
        tensors = [t.clone().requires_grad_() for t in leaves]
        with torch.autocast("cuda", torch.bfloat16):
            out = losses.pool_logsumexp(*tensors, pool, targets, fixed["seen"], fixed["rows"], fixed["limit"])
        out.sum().backward()
        return [out.detach()] + [t.grad for t in tensors]

    first, again = run(), run()
    for name, a, b in zip(("lse", "query", "vectors", "bias"), first, again):
        assert torch.equal(a, b), name


def test_the_pool_kernels_leave_out_what_the_blocks_leave_out(monkeypatch):
    """Every mask the blocks apply, at shapes off the kernels' blocks: special items at -inf, seen items up to
    each position's limit, each position's own target; the kernels no farther from the float32 blocks than
    the bf16 blocks are (twice, plus a little). A pool that leaves every position nothing gives -inf and no
    gradient at all (no NaN)."""
    gen = torch.Generator("cuda").manual_seed(3)
    positions, samples, window, pool_size, hidden = 333, 7, 30, 517, 40
    query = torch.randn(positions, hidden, device="cuda", generator=gen)
    vectors = torch.randn(pool_size, hidden, device="cuda", generator=gen) * 0.3
    pool = torch.randint(2, 300, (pool_size,), device="cuda", generator=gen)
    pool[:5] = 0  # padding in the pool: its bias -inf
    bias = torch.randn(pool_size, device="cuda", generator=gen).masked_fill(pool == 0, float("-inf"))
    targets = torch.randint(2, 300, (positions,), device="cuda", generator=gen)
    history = torch.randint(0, 300, (samples, window), device="cuda", generator=gen)
    history[0] = pool[:window]  # sample 0 has seen the pool's first items
    seen = losses.first_columns(history, pool)
    rows = torch.arange(positions, device="cuda") * samples // positions
    limit = torch.randint(-1, window, (positions,), device="cuda", generator=gen).to(torch.int16)

    def run(kernels: bool, items: torch.Tensor, wanted: torch.Tensor, bf16: bool = True):
        monkeypatch.setattr(PoolKernels, "enabled", kernels)
        leaves = [t.clone().requires_grad_() for t in (query, vectors, bias)]
        with torch.autocast("cuda", torch.bfloat16, enabled=bf16):
            out = losses.pool_logsumexp(*leaves, items, wanted, seen, rows, limit)
        out.where(out.isfinite(), 0.0).sum().backward()
        return [out.detach()] + [t.grad for t in leaves]

    def distance(got, exact):
        keep = exact.isfinite()
        return float((got[keep].float() - exact[keep]).norm() / exact[keep].norm())

    kernel, block, exact = run(True, pool, targets), run(False, pool, targets), run(False, pool, targets, bf16=False)
    assert torch.equal(kernel[0].isneginf(), exact[0].isneginf())
    assert exact[0].isfinite().sum() > positions // 2 and exact[0].isneginf().sum() == 0
    for name, got, plain, want in zip(("lse", "query", "vectors", "bias"), kernel, block, exact):
        assert got.isfinite().all() or name == "lse", name
        print(f"{name}: kernels {distance(got, want):.5f}, blocks {distance(plain, want):.5f}")
        assert distance(got, want) <= 2 * distance(plain, want) + 1e-3, name
    lone = pool.clone()
    lone[5:] = 7  # padding and every position's own target alone: nothing left
    nothing = run(True, lone, torch.full_like(targets, 7))
    assert nothing[0].isneginf().all()
    for grad in nothing[1:]:
        assert torch.equal(grad, torch.zeros_like(grad))


def test_a_seed_repeats_its_negatives_on_the_gpu():
    """The same seed, the same 8,192 negatives over a million items, bit for bit; another seed, others. (CUDA's
    multinomial with replacement, drawn before, did not repeat them: its cumulative sum varies call to call.)"""
    counts = np.random.default_rng(0).integers(0, 100, 1_000_002).astype(np.float64)
    for name in ("sampled-uniform", "sampled-popularity"):
        loss = CatalogueLoss(LossSettings(name, negatives=8192), counts, 1_000_001, "cuda")
        drawn = loss.draw(torch.Generator("cuda").manual_seed(7))
        assert torch.equal(drawn, loss.draw(torch.Generator("cuda").manual_seed(7))), name
        assert not torch.equal(drawn, loss.draw(torch.Generator("cuda").manual_seed(8))), name
        assert int(drawn.min()) >= 1 and int(drawn.max()) <= 1_000_000, name
