"""The output layer's item table in 8 bits: float8 e4m3 with a scale an item, scored by ``torch._scaled_mm``.

At a million items the served graph's batch-1 call is a read of the item table (512 MB in bf16, 1M x 256); in
float8 it reads half that. Each item's row is scaled to its own largest value (448, e4m3's largest), each query
row likewise, and the product sums in float32 (cuBLAS on GPUs of compute capability 8.9 and up: L4, L40S, H100,
H200; the CPU computes the same for checks). ``_scaled_mm`` takes a table whose row count is a multiple of 16,
so the table is padded with zero rows and the product has that many columns: callers take the first V.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_LARGEST = 448.0  # float8_e4m3fn's largest finite value
MULTIPLE = 16  # _scaled_mm's dimensions (the table's rows, the hidden width) come in multiples of 16


def quantize_rows(table: torch.Tensor, multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, H) floating-point rows as float8 e4m3 and each row's scale (R, 1) float32, so that
    ``rows.float() * scale`` is the table within e4m3's rounding. Rows past R, up to a multiple of ``multiple``,
    are zeros; a row of zeros stays zeros."""
    table = F.pad(table.float(), (0, 0, 0, (-table.shape[0]) % multiple))
    scale = table.abs().amax(1, keepdim=True).clamp(min=1e-12) / FP8_LARGEST
    return (table / scale).to(FP8), scale


def dequantized(rows: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 table that ``quantize_rows``' answer stands for."""
    return rows.float() * scale


def scaled_product(query: torch.Tensor, rows: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """query (B, H) against a ``quantize_rows`` table (V', H) with its scales as one row (1, V'): the (B, V')
    products in the query's dtype, the query quantized a row at a time as the table is."""
    batch = query.shape[0]
    padded, query_scale = quantize_rows(query, MULTIPLE)  # _scaled_mm's first operand in whole 16-row tiles
    product = torch._scaled_mm(padded, rows.T, query_scale, scale, out_dtype=query.dtype)
    return product[:batch]
