"""The transpose of a 16x16-tiled NVFP4 matrix (``ops.transpose_tiles``: a weight's fprop quantization as its
dgrad's) in one Triton launch: each program reads a BR x BK tile of the packed codes and its block of tile scales
and writes them transposed, the codes re-paired along the other dim. Byte for byte the reference's
(``reference.nvfp4.transpose_tiles_ref``), whose torch ops are six kernels on a GPU, each a launch its host pays for.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..core.launch import cdiv

BLOCK_R, BLOCK_K = 64, 64  # a tile of 64 x 64 codes: 2 KiB read, 2 KiB written, 32 codes per thread (4 warps)


@triton.jit
def _transpose_tiles_kernel(codes_ptr, scales_ptr, out_codes_ptr, out_scales_ptr, R, K, BR: tl.constexpr,
                            BK: tl.constexpr):
    """Rows ``program_id(0) * BR``.. and columns ``program_id(1) * BK``.. of the (R, K) codes (stored (R, K/2),
    the even column in the low nibble; R and K multiples of 16) written to the (K, R) codes stored (K, R/2), and
    the (BR/16, BK/16) block of the (R/16, K/16) tile scales to the (K/16, R/16) scales."""
    r0 = tl.program_id(0) * BR
    c0 = tl.program_id(1) * BK
    rows = r0 + tl.arange(0, BR)
    pairs = c0 // 2 + tl.arange(0, BK // 2)
    mask = (rows < R)[:, None] & (pairs < K // 2)[None, :]
    packed = tl.load(codes_ptr + rows.to(tl.int64)[:, None] * (K // 2) + pairs[None, :], mask=mask, other=0)
    packed = packed.to(tl.int32)
    codes = tl.trans(tl.reshape(tl.join(packed & 0xF, packed >> 4), (BR, BK)))  # [BK, BR]: code (r, c) at [c, r]
    lo, hi = tl.split(tl.reshape(codes, (BK, BR // 2, 2)))
    cols = c0 + tl.arange(0, BK)
    out_pairs = r0 // 2 + tl.arange(0, BR // 2)
    out_mask = (cols < K)[:, None] & (out_pairs < R // 2)[None, :]
    tl.store(out_codes_ptr + cols.to(tl.int64)[:, None] * (R // 2) + out_pairs[None, :], (lo | (hi << 4)).to(tl.uint8),
             mask=out_mask)
    tile_rows = r0 // 16 + tl.arange(0, BR // 16)
    tile_cols = c0 // 16 + tl.arange(0, BK // 16)
    smask = (tile_rows < R // 16)[:, None] & (tile_cols < K // 16)[None, :]
    scales = tl.load(scales_ptr + tile_rows[:, None] * (K // 16) + tile_cols[None, :], mask=smask)
    tl.store(out_scales_ptr + tile_cols[None, :] * (R // 16) + tile_rows[:, None], scales, mask=smask)


def transpose_tiles_triton(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.nvfp4.transpose_tiles_ref`` of contiguous uint8 ``codes`` (R, K/2) and ``scales`` (R/16, K/16)."""
    rows, k = codes.shape[0], 2 * codes.shape[1]
    out_codes = torch.empty(k, rows // 2, device=codes.device, dtype=torch.uint8)
    out_scales = torch.empty(scales.shape[1], scales.shape[0], device=scales.device, dtype=torch.uint8)
    if codes.numel():
        _transpose_tiles_kernel[(cdiv(rows, BLOCK_R), cdiv(k, BLOCK_K))](codes, scales, out_codes, out_scales, rows,
                                                                         k, BR=BLOCK_R, BK=BLOCK_K)
    return out_codes, out_scales
