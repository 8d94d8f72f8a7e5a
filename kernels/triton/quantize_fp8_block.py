"""Triton FP8-block quantizer: a tensor along one axis to E4M3 codes with fp32 power-of-two scales per 1x128 block
or 128x128 tile, bit for bit ``reference.fp8_block`` (round to nearest; the reference alone takes random bits).

One program quantizes ``BR`` rows of one 128-wide block column (a 128x128 tile: ``BR`` is 128 and the amax runs
over the whole tile), reading the (R, K) view in place whatever its strides (a column copy reads down a strided
dim). The encode factor's division is correctly rounded (``div_rn``), as the reference's fp32 quotient is.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoprec.formats import FP8_BLOCK

from ..core.launch import hardware_fp8
from ..core.quantized import QuantizedTensor, normalize_axis
from .numerics import FLT_MAX, floor_log2, pow2, round_and_encode_fp8
from .quantize_rows import as_matrix

BLOCK = FP8_BLOCK.block_size
ROWS = 32  # rows per program for 1x128 blocks
TILE_WARPS = 8  # a 128x128 tile's program: 64 elements per thread, no register spills on sm_90 (tests)


@triton.jit
def _fp8_block_kernel(x_ptr, stride_r, stride_k, codes_ptr, scales_ptr, n_rows, k_blocks,
                      BR: tl.constexpr, TILE: tl.constexpr, HW: tl.constexpr):
    pid_r, kb = tl.program_id(0), tl.program_id(1)
    rows = pid_r * BR + tl.arange(0, BR)
    cols = kb * 128 + tl.arange(0, 128)
    in_rows = rows < n_rows
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_r + cols[None, :].to(tl.int64) * stride_k,
                mask=in_rows[:, None], other=0.0).to(tl.float32)
    finite = tl.abs(x) <= FLT_MAX  # false for NaN and Inf
    a = tl.where(finite, tl.abs(x), 0.0)
    bad = tl.where(finite, 0, 1)
    if TILE:
        amax = tl.max(tl.max(a, 1), 0)
        any_bad = tl.max(tl.max(bad, 1), 0)
        amax = tl.full((BR,), 0.0, tl.float32) + amax
        any_bad = tl.full((BR,), 0, tl.int32) + any_bad
    else:
        amax = tl.max(a, 1)
        any_bad = tl.max(bad, 1)
    q = tl.math.div_rn(tl.full((BR,), 448.0, tl.float32), amax)
    q = tl.where(q > FLT_MAX, FLT_MAX, q)
    e = tl.where(amax > 0, floor_log2(q), 0)
    code = round_and_encode_fp8(x * pow2(e)[:, None], 0, 4, 3, 7, 448.0, False, HW)
    tl.store(codes_ptr + rows[:, None].to(tl.int64) * (k_blocks * 128) + cols[None, :], code.to(tl.uint8),
             mask=in_rows[:, None])
    decode = pow2(-tl.minimum(e, 126))
    decode = tl.where(e >= 127, decode * 0.5, decode)  # 2**-127: an fp32 subnormal
    scale = tl.where(any_bad > 0, float("nan"), decode)
    if TILE:
        first = tl.arange(0, BR) == 0
        tl.store(scales_ptr + (pid_r * k_blocks + kb + tl.arange(0, BR) * 0), scale, mask=first)
    else:
        tl.store(scales_ptr + rows.to(tl.int64) * k_blocks + kb, scale, mask=in_rows)


def quantize_fp8_block_triton(x: torch.Tensor, axis: int = -1, *, tile2d: bool = False) -> QuantizedTensor:
    """``reference.fp8_block.quantize_fp8_block_ref`` of ``x`` (checked by the caller) along ``axis``, round to
    nearest, in one launch."""
    axis = normalize_axis(axis, x.ndim)
    m = as_matrix(x, axis)
    n_rows, k = m.shape
    stored = x.shape[:axis] + x.shape[axis + 1:] + (k,)
    codes = torch.empty(stored, device=x.device, dtype=torch.uint8)
    rows = BLOCK if tile2d else ROWS
    scale_rows = n_rows // BLOCK if tile2d else n_rows
    scales = torch.empty((scale_rows, k // BLOCK), device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(n_rows, rows), k // BLOCK)
    _fp8_block_kernel[grid](m, m.stride(0), m.stride(1), codes, scales, n_rows, k // BLOCK, BR=rows, TILE=tile2d,
                            HW=hardware_fp8(x.device), num_warps=TILE_WARPS if tile2d else 4)
    scales = scales.reshape(stored[:-1] + (k // BLOCK,)) if not tile2d else scales
    return QuantizedTensor(FP8_BLOCK, codes.view(torch.float8_e4m3fn), scales, None, axis, x.shape,
                           BLOCK if tile2d else 1)
