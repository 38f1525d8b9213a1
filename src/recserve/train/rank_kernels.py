"""The ranking's count at catalogue scale as Triton kernels on a GPU: each batch's queries against the item
table tile by tile, the bias added and every tile counted against each user's target score where it is made,
so that no (users x catalogue) score is ever written to memory.

The scores of named items (each target, the histories that are excluded, the sampled negatives) come from
the same tile code (``_tile``) as the count's, with the same blocks and the same order of sums: a named item
and the catalogue's copy of it have the same float32 bits, so a tie is decided alike wherever it is met (it
counts against the target). The products run on tensor cores in three TF32 passes (float32 as a high and a
low part, made once a batch; the low-by-low product dropped), close to float32's accuracy at about twice the
speed of float32 products on CUDA cores (benchmarks/rank_kernel_configs.py).

Used by ``leave_one_out.Ranker`` for a transformer's scores on a GPU where Triton imports; elsewhere (a CPU,
a score function that is no transformer) the dense scores of ``leave_one_out`` are ranked instead.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

try:  # Triton ships with PyTorch's CUDA builds; a CPU install has none
    import triton  # type: ignore[import-not-found, unused-ignore]
    import triton.language as tl  # type: ignore[import-not-found, unused-ignore]
    from triton.runtime.errors import OutOfResources  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - the CPU test machines have no Triton
    triton = None

BLOCK = 128  # users and items a tile (both: a pair's score is the diagonal of a tile of the same shape)
BLOCK_K = 64  # the hidden width a step of a tile's product
# each program's warps and its loads' pipeline depth: the count's (two tiles of items in flight, 192 KB of shared
# memory under "split" beside the users' rows), and the pair kernel's (one step of the hidden width at a time:
# its few tiles gain nothing from a pipeline that would not fit an H100's 227 KB)
NUM_WARPS, NUM_STAGES, PAIR_STAGES = 8, 2, 1
# the count's grid: about this many programs a multiprocessor, each a run of item tiles (16: the last wave of
# programs a smaller share of the count than with 4 or 8; benchmarks/rank_kernel_configs.py on an H100)
PROGRAMS_PER_SM = 16
# the first that compiles is used. split: three TF32 products of high and low parts made once a batch
# (``split_tf32``); tf32x3: the same, Triton's, which splits both operands again in every tile; ieee: float32
# products on CUDA cores (benchmarks/rank_kernel_configs.py compares them)
PRECISIONS = ("split", "tf32x3", "ieee")


def available(device: torch.device) -> bool:
    """True where the kernels run: a CUDA device, Triton importable and ``TileScores.enabled``."""
    return TileScores.enabled and triton is not None and device.type == "cuda"


if triton is not None:

    @triton.jit
    def _operand(ptr, low_ptr, rows, row_ok, ks, k_ok, stride, PRECISION: tl.constexpr):
        """The rows ``rows`` of a matrix at the columns ``ks`` (zero where masked), and their low parts under
        "split" (the rows again otherwise, unused)."""
        at = rows[:, None] * stride + ks[None, :]
        mask = row_ok[:, None] & k_ok[None, :]
        high = tl.load(ptr + at, mask=mask, other=0.0)
        low = high
        if PRECISION == "split":  # no return in the branch: Triton would compile what follows it too
            low = tl.load(low_ptr + at, mask=mask, other=0.0)
        return high, low

    @triton.jit
    def _product(acc, q, q_low, e, e_low, PRECISION: tl.constexpr):
        """``acc`` plus the products of query rows with item rows over one step of the hidden width: under
        "split" three TF32 products of the parts (the low-by-low one dropped), in this order."""
        if PRECISION == "split":
            acc = tl.dot(q_low, tl.trans(e), acc, input_precision="tf32")
            acc = tl.dot(q, tl.trans(e_low), acc, input_precision="tf32")
            acc = tl.dot(q, tl.trans(e), acc, input_precision="tf32")
        else:
            acc = tl.dot(q, tl.trans(e), acc, input_precision=PRECISION)
        return acc

    @triton.jit
    def _tile(
        q_ptr,
        e_ptr,
        q_low_ptr,
        e_low_ptr,
        rows,
        cols,
        row_ok,
        col_ok,
        hidden,
        q_stride,
        e_stride,
        BLOCK: tl.constexpr,
        BLOCK_K: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """(BLOCK, BLOCK) float32 products of the query rows ``rows`` with the item rows ``cols``, step by step
        of ``BLOCK_K`` of the hidden width: the sums in the count's order."""
        acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
        for k0 in range(0, hidden, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < hidden
            q, q_low = _operand(q_ptr, q_low_ptr, rows, row_ok, ks, k_ok, q_stride, PRECISION)
            e, e_low = _operand(e_ptr, e_low_ptr, cols, col_ok, ks, k_ok, e_stride, PRECISION)
            acc = _product(acc, q, q_low, e, e_low, PRECISION)
        return acc

    @triton.jit
    def _count_kernel(
        q_ptr,
        e_ptr,
        q_low_ptr,
        e_low_ptr,
        bias_ptr,
        target_ptr,
        target_score_ptr,
        above_ptr,
        bad_ptr,
        scores_ptr,
        users,
        items,
        hidden,
        q_stride,
        e_stride,
        mask_index,
        items_per_program,
        BLOCK: tl.constexpr,
        BLOCK_K: tl.constexpr,
        K_STEPS: tl.constexpr,
        HOLD_ROWS: tl.constexpr,
        PRECISION: tl.constexpr,
        WRITE_SCORES: tl.constexpr,
    ):
        """Program (m, n): users ``m * BLOCK`` on, items ``n * items_per_program`` on; adds to each user's
        count the rankable items (not padding, the mask token or the target) scoring at least the target's
        score, and flags a rankable item's NaN or infinite score. WRITE_SCORES (tests): every score too.

        One loop over the program's (item tile, step of the hidden width) pairs, ``K_STEPS`` steps a tile, each
        tile counted after its last step, so that Triton can pipeline the tiles' loads (a loop nested in the
        tiles' loop pipelines only its own few steps). HOLD_ROWS (one step a tile): the users' rows are read once,
        before the loop; that, not the pipeline, is what made the count faster on an H100 (44 against 57 ms for
        20,000 users x 1M items; one stage as fast as two)."""
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        row_ok = rows < users
        target = tl.load(target_ptr + rows, mask=row_ok, other=-1).to(tl.int32)  # a tile's compares in 32 bits
        target_score = tl.load(target_score_ptr + rows, mask=row_ok, other=float("inf"))
        above = tl.zeros((BLOCK,), dtype=tl.int32)
        bad = tl.zeros((BLOCK,), dtype=tl.int32)
        first = tl.program_id(1) * items_per_program
        tiles = tl.cdiv(tl.minimum(first + items_per_program, items) - first, BLOCK)
        if HOLD_ROWS:
            ks = tl.arange(0, BLOCK_K)
            q, q_low = _operand(q_ptr, q_low_ptr, rows, row_ok, ks, ks < hidden, q_stride, PRECISION)
        acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
        for step in range(0, tiles * K_STEPS):
            cols = first + (step // K_STEPS) * BLOCK + tl.arange(0, BLOCK)
            col_ok = cols < items
            ks = (step % K_STEPS) * BLOCK_K + tl.arange(0, BLOCK_K)
            k_ok = ks < hidden
            if not HOLD_ROWS:
                q, q_low = _operand(q_ptr, q_low_ptr, rows, row_ok, ks, k_ok, q_stride, PRECISION)
            e, e_low = _operand(e_ptr, e_low_ptr, cols, col_ok, ks, k_ok, e_stride, PRECISION)
            acc = _product(acc, q, q_low, e, e_low, PRECISION)
            if step % K_STEPS == K_STEPS - 1:  # the tile's products are whole: count them
                scores = acc + tl.load(bias_ptr + cols, mask=col_ok, other=0.0)[None, :]
                rankable = (col_ok & (cols != 0) & (cols != mask_index))[None, :] & row_ok[:, None]
                counted = rankable & (cols[None, :] != target[:, None]) & (scores >= target_score[:, None])
                above += tl.sum(counted.to(tl.int32), 1)
                finite = (scores == scores) & (tl.abs(scores) != float("inf"))
                bad = tl.maximum(bad, tl.max((rankable & ~finite).to(tl.int32), 1))
                if WRITE_SCORES:
                    tl.store(
                        scores_ptr + rows[:, None] * items + cols[None, :],
                        scores,
                        mask=row_ok[:, None] & col_ok[None, :],
                    )
                acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
        tl.atomic_add(above_ptr + rows, above, mask=row_ok)
        tl.atomic_max(bad_ptr + rows, bad, mask=row_ok)

    @triton.jit
    def _pair_kernel(
        q_ptr,
        e_ptr,
        q_low_ptr,
        e_low_ptr,
        bias_ptr,
        users_ptr,
        items_ptr,
        out_ptr,
        pairs,
        hidden,
        q_stride,
        e_stride,
        BLOCK: tl.constexpr,
        BLOCK_K: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """The score of ``BLOCK`` (user, item) pairs: the diagonal of their tile, as the count makes it."""
        index = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = index < pairs
        rows = tl.load(users_ptr + index, mask=ok, other=0)
        cols = tl.load(items_ptr + index, mask=ok, other=0)
        products = _tile(
            q_ptr,
            e_ptr,
            q_low_ptr,
            e_low_ptr,
            rows,
            cols,
            ok,
            ok,
            hidden,
            q_stride,
            e_stride,
            BLOCK,
            BLOCK_K,
            PRECISION,
        )
        diagonal = tl.arange(0, BLOCK)[:, None] == tl.arange(0, BLOCK)[None, :]
        scores = tl.sum(tl.where(diagonal, products, 0.0), 1) + tl.load(bias_ptr + cols, mask=ok, other=0.0)
        tl.store(out_ptr + index, scores, mask=ok)


SETTING = ("BLOCK", "BLOCK_K", "NUM_WARPS", "NUM_STAGES", "PROGRAMS_PER_SM")  # a setting's fields, in order


def setting() -> str:
    """The kernels' setting as the benchmarks write it: BLOCK/BLOCK_K/warps/stages/programs a multiprocessor."""
    return "/".join(str(globals()[name]) for name in SETTING)


def use_setting(text: str) -> None:
    """Takes a setting as ``setting`` writes it; its first four fields alone leave the programs as they are.

    Raises:
        ValueError: not four or five positive integers joined by /.
    """
    fields = text.split("/")
    if len(fields) not in (4, 5) or not all(f.isdigit() and int(f) > 0 for f in fields):
        raise ValueError(f"{text!r}: expected BLOCK/BLOCK_K/warps/stages[/programs], positive integers")
    globals().update((name, int(f)) for name, f in zip(SETTING, fields))


def pair_constants(precision: str) -> dict:
    """The pair kernel's compile-time arguments under ``precision``."""
    return {"BLOCK": BLOCK, "BLOCK_K": BLOCK_K, "PRECISION": precision}


def count_constants(hidden: int, precision: str, write_scores: bool = False) -> dict:
    """The count kernel's compile-time arguments for queries ``hidden`` wide under ``precision``."""
    k_steps = -(-hidden // BLOCK_K)
    return {
        "BLOCK": BLOCK,
        "BLOCK_K": BLOCK_K,
        "K_STEPS": k_steps,
        # held on CUDA cores (ieee), the rows gave a target's score another rounding than the pair kernel's (an
        # H100, tests/gpu/test_ranking_gpu.py): there they are read with each tile, as the pair kernel reads them
        "HOLD_ROWS": k_steps == 1 and precision != "ieee",
        "PRECISION": precision,
        "WRITE_SCORES": write_scores,
    }


def split_tf32(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``x`` as a high part that TF32 holds exactly (its low 13 mantissa bits cleared) and the rest,
    ``x - high`` (exact in float32)."""
    high = (x.view(torch.int32) & -(1 << 13)).view(torch.float32)
    return high, x - high


class TileScores:
    """A batch's scores ``query @ table.T + bias`` that are never materialised: counted, or read at named items.

    Args:
        query: (B, H) the users' queries; table: (V, H) the item rows; bias: (V,) float32.
    """

    enabled = True  # False: the dense scores everywhere (for comparison)
    precision: str | None = None  # the first of PRECISIONS that compiled here, once known
    count_stages: int | None = None  # the count's pipeline depth that fits here, once known

    def __init__(self, query: torch.Tensor, table: torch.Tensor, bias: torch.Tensor):
        self.query = query.float().contiguous()
        self.table = table.float().contiguous()
        self.bias = bias.float().contiguous()
        self._split: tuple[torch.Tensor, ...] | None = None

    def at(self, columns: torch.Tensor) -> torch.Tensor:
        """(B, K) float32 scores of the items ``columns`` (B, K), each row's for its own user."""
        users = torch.arange(columns.shape[0], device=columns.device)[:, None].expand_as(columns)
        users, items = users.reshape(-1).contiguous(), columns.reshape(-1).contiguous()
        out = torch.empty(items.shape, dtype=torch.float32, device=columns.device)
        if items.numel():
            self._launch(
                lambda precision: _pair_kernel[(triton.cdiv(items.numel(), BLOCK),)](
                    *self._operands(precision),
                    self.bias,
                    users,
                    items,
                    out,
                    items.numel(),
                    self.query.shape[1],
                    self.query.stride(0),
                    self.table.stride(0),
                    **pair_constants(precision),
                    num_warps=NUM_WARPS,
                    num_stages=PAIR_STAGES,
                )
            )
        return out.view(columns.shape)

    def tally(self, target: torch.Tensor, mask_index: int, scores_out: torch.Tensor | None = None):
        """``leave_one_out``'s tally: each target's score (B, 1), how many rankable items other than it score
        at least as high (B,), and whether a rankable item scored NaN or +-inf (B,). ``scores_out`` (B, V)
        float32, for tests: every score written there as the count met it.

        Where a kernel needs more shared memory than the GPU has, the whole tally runs again lighter
        (``lighter``): the target's score and the count always come from the same precision."""
        while True:
            try:
                return self._tally(target, mask_index, scores_out)
            except OutOfResources as err:
                if not TileScores.lighter():
                    raise
                log.warning(
                    "the ranking's count runs %s, %d stage(s) deep: %s",
                    TileScores.precision,
                    TileScores.count_stages or NUM_STAGES,
                    err,
                )

    @staticmethod
    def lighter() -> bool:
        """After a kernel needed more shared memory than the GPU has (an A100's 164 KB, an A10G's 99 KB): the
        count's loads one tile at a time (the same sums), else the next of ``PRECISIONS`` from the start; False
        where none is left."""
        if TileScores.count_stages != 1:
            TileScores.count_stages = 1
            return True
        at = PRECISIONS.index(TileScores.precision) if TileScores.precision in PRECISIONS else -1
        if at + 1 >= len(PRECISIONS):
            return False
        TileScores.precision, TileScores.count_stages = PRECISIONS[at + 1], None
        return True

    def _tally(self, target: torch.Tensor, mask_index: int, scores_out: torch.Tensor | None):
        target_score = self.at(target[:, None])
        users, items = self.query.shape[0], self.table.shape[0]
        above = torch.zeros(users, dtype=torch.int32, device=target.device)
        bad = torch.zeros(users, dtype=torch.int32, device=target.device)
        user_blocks = triton.cdiv(users, BLOCK)
        sms = torch.cuda.get_device_properties(target.device).multi_processor_count
        splits = max(1, min(triton.cdiv(items, BLOCK), triton.cdiv(PROGRAMS_PER_SM * sms, user_blocks)))
        per_program = triton.cdiv(triton.cdiv(items, splits), BLOCK) * BLOCK
        stages = TileScores.count_stages or NUM_STAGES
        self._launch(
            lambda precision: _count_kernel[(user_blocks, triton.cdiv(items, per_program))](
                *self._operands(precision),
                self.bias,
                target.contiguous(),
                target_score.contiguous(),
                above,
                bad,
                scores_out if scores_out is not None else above,
                users,
                items,
                self.query.shape[1],
                self.query.stride(0),
                self.table.stride(0),
                mask_index,
                per_program,
                **count_constants(self.query.shape[1], precision, scores_out is not None),
                num_warps=NUM_WARPS,
                num_stages=stages,
            )
        )
        TileScores.count_stages = stages
        return target_score, above.long(), bad.bool()

    def _operands(self, precision: str) -> tuple[torch.Tensor, ...]:
        """The query and the table, then their low parts (their own selves but under "split")."""
        if precision != "split":
            return self.query, self.table, self.query, self.table
        if self._split is None:
            (q_high, q_low), (e_high, e_low) = split_tf32(self.query), split_tf32(self.table)
            self._split = (q_high, e_high, q_low, e_low)
        return self._split

    def _launch(self, launch) -> None:
        """Runs ``launch(precision)`` with the first of ``PRECISIONS`` that compiles here."""
        if TileScores.precision is not None:
            launch(TileScores.precision)
            return
        for precision in PRECISIONS:
            try:
                launch(precision)
            except Exception as err:  # Triton's compile errors have no common base class
                if precision == PRECISIONS[-1]:
                    raise
                log.warning("the ranking's products run without %s: %s", precision, err)
                continue
            TileScores.precision = precision
            return
