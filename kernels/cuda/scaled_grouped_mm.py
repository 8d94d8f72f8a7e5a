"""Blackwell's native grouped block-scaled GEMM (sm_100, compute capability 10.x) for experts: ``torch.nn.functional.
scaled_grouped_mm`` in one launch for every expert, 2d x 3d (fprop, dgrad) and 2d x 2d (wgrad), on the grouped
quantizers' buffers as they come, with the scales laid out on the device: nothing is read on the host.

Operands are laid out as torch's contract for the grouped kernels asks (pytorch's ``GroupedBlas.cpp``, its
block-scale checks and the MSLK grouped kernels it calls, and torchao's MoE scale layouts, which size them for any
group sizes as here). A is row-major, B column-major; codes are FP8 E4M3 or packed
``float4_e2m1fn_x2``; block scales are in ``SWIZZLE_32_4_4`` (``swizzle.swizzle_scales``), group after group:

- 2d x 3d: A is the (T, K) token rows (``quantize_row_groups``); its scales put each group's rows from a multiple
  of 128 rows (the padded starts a cumsum of each group's size rounded up to 128), the buffer sized for any group
  sizes, ``ceil(T / 128)·128 + 128·E`` rows. Since 128-row tiles come first in the layout, swizzling the whole
  buffer gives each group's swizzled slab one after the other. B is every expert's (N, K) codes
  (``quantize_batches``) viewed (E, K, N); its scales each expert's rows padded to 128 and swizzled, one row per
  expert. Rows past the last offset are zeroed after the GEMM.
- 2d x 2d: groups run along the reduction (tokens). A (M, KP) and B (N, KP) are K-grouped
  (``quantize_k_groups_triton``): each group zero-padded to a multiple of 128 tokens (so of 32, whole MXFP8 blocks
  and 16-byte runs of NVFP4 codes), the last group taking the trailing zero columns so that the offsets end at
  KP. Scales go chunk after chunk: each group's (M or N, its blocks) slab swizzled on its own (its 4-column tiles
  moved on the device from the whole matrix's swizzle). An expert with no tokens gets a zero gradient.
- NVFP4 also takes one FP32 tensor scale per group for each operand (``TensorWise`` with E values, 1 for an
  empty group); the kernel multiplies a group's accumulator by the product of its two.
- ``offs``: int32 cumulative group ends; the output is bf16, the only type the grouped kernels write.

Equal to the per-group loop up to fp32 accumulation order. Not run on a Blackwell part yet: the tests check
the arguments against the contract above with a stand-in that decodes them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.group_offsets import group_sizes, held_ends, padded_sources, padded_width, zero_unwritten
from ..core.operand import KIND_NVFP4, Operand
from ..core.quantized import QuantizedGroups
from .grouped_bf16 import too_many_groups
from .scaled_mm import native_problem, row_scales
from .swizzle import TILE_COLS, TILE_ROWS, swizzle_scales

TILE = TILE_ROWS * TILE_COLS  # scales per swizzled tile
# compute capability majors where torch runs block-scaled groups: its scaled_grouped_mm refuses all but 9.x and 10.x,
# and has only row-wise FP8 on 9.x (so not sm_110 or sm_120, whose dense block-scaled GEMMs cuBLAS does run)
NATIVE_GROUPED_MAJORS = (10,)


def grouped_native_problem(layout: str, a: Operand, b: Operand, out_dtype: torch.dtype, groups: int) -> str | None:
    """Why the native grouped GEMM does not take a grouped product in ``groups`` groups with operands like ``a`` and
    ``b`` (one group's, or a shape-only stand-in; every group shares their formats and the dims not grouped), None
    when it does."""
    if layout not in ("2d3d", "2d2d"):
        return f"layout {layout} (the native grouped GEMM runs 2d x 3d and 2d x 2d)"
    if too_many_groups(groups):
        return too_many_groups(groups)
    if out_dtype != torch.bfloat16:
        return f"out_dtype {out_dtype} (the native grouped GEMM writes bfloat16)"
    if a.rows == 0 or b.rows == 0:
        return "an empty operand"
    if torch.float8_e5m2 in (a.fmt.elem.torch_dtype, b.fmt.elem.torch_dtype):
        return "an E5M2 operand (the native grouped GEMM takes E4M3 codes)"
    return native_problem(a, b)


def _row_group_scales(scales: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Token groups' (T, C) block scales in the 2d x 3d layout (module doc), computed on the device."""
    t = scales.shape[0]
    total = padded_width(t, offs.shape[0], TILE_ROWS)
    source, filled = padded_sources(offs, TILE_ROWS, total)  # the rest of a group's padded slab (and past) zero
    slab = torch.where(filled[:, None], scales.view(torch.uint8)[source.clamp_(0, t - 1)], 0)
    return swizzle_scales(slab).view(total, -1)


def _batch_scales(qb: QuantizedGroups) -> torch.Tensor:
    """Each expert's (N, K/block) block scales (16x16 tiles repeated over their rows) swizzled, one row per
    expert: the experts' rows padded to 128 and stacked, then swizzled at once (128-row tiles first)."""
    experts, _, n = qb.shape
    scales = F.pad(row_scales(qb.scales, qb.tile_rows, n), (0, 0, 0, -n % TILE_ROWS))
    return swizzle_scales(scales.reshape(-1, scales.shape[-1])).view(experts, -1)


def _k_group_scales(scales: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """K-grouped (R, KP/block) block scales in the 2d x 2d layout (module doc): the whole matrix swizzled, then each
    4-column tile moved to its group's chunk, on the device. ``ends``: the groups' ends in scale columns, whole
    tiles, the last at KP/block."""
    r, c = scales.shape
    row_tiles, col_tiles = -(-r // TILE_ROWS), c // TILE_COLS
    tiles = swizzle_scales(scales.view(torch.uint8)).view(row_tiles * col_tiles, TILE)
    tile_ends = ends.long() // TILE_COLS
    tile_starts = tile_ends - group_sizes(tile_ends)
    cols = torch.arange(col_tiles, device=scales.device)
    g = torch.bucketize(cols, tile_ends, right=True)
    first, width = tile_starts[g], (tile_ends - tile_starts)[g]
    rows = torch.arange(row_tiles, device=scales.device)[:, None]
    dest = first * row_tiles + rows * width + cols - first  # group g's chunk: its (row tile, column tile) order
    out = torch.empty_like(tiles).index_copy_(0, dest.flatten(), tiles)
    return out.view(row_tiles * TILE_ROWS, c)


def _call(codes_a: torch.Tensor, codes_b: torch.Tensor, scales_a: torch.Tensor, scales_b: torch.Tensor,
          ts_a: torch.Tensor | None, ts_b: torch.Tensor | None, nvfp4: bool, offs: torch.Tensor) -> torch.Tensor:
    """``F.scaled_grouped_mm`` on uint8 codes and swizzled uint8 scales, with NVFP4's per-group tensor scales."""
    swizzled = F.SwizzleType.SWIZZLE_32_4_4
    if nvfp4:
        codes_a, codes_b = codes_a.view(torch.float4_e2m1fn_x2), codes_b.view(torch.float4_e2m1fn_x2)
        scale_a = [scales_a.view(torch.float8_e4m3fn), ts_a.float().contiguous()]
        scale_b = [scales_b.view(torch.float8_e4m3fn), ts_b.float().contiguous()]
        recipe = [F.ScalingType.BlockWise1x16, F.ScalingType.TensorWise]
        swizzle = [swizzled, F.SwizzleType.NO_SWIZZLE]
    else:
        codes_a, codes_b = codes_a.view(torch.float8_e4m3fn), codes_b.view(torch.float8_e4m3fn)
        scale_a, scale_b = scales_a.view(torch.float8_e8m0fnu), scales_b.view(torch.float8_e8m0fnu)
        recipe, swizzle = F.ScalingType.BlockWise1x32, swizzled
    return F.scaled_grouped_mm(codes_a, codes_b, scale_a, recipe, scale_b, recipe, swizzle, swizzle,
                               offs=offs.to(torch.int32), output_dtype=torch.bfloat16)


def experts_native(qa: QuantizedGroups, qb: QuantizedGroups, offs: torch.Tensor) -> torch.Tensor:
    """The (T, N) bf16 experts product (2d x 3d) of token groups ``qa`` (ending at ``offs``) and expert weights
    ``qb``, rows past the last offset zero (``grouped_native_problem`` is None for them)."""
    nvfp4 = qa.tensor_scales is not None
    offs = held_ends(offs, qa.shape[0])  # torch's kernel trusts them to stay within the tokens
    codes_b = qb.codes.view(torch.uint8).transpose(1, 2)  # (E, K, N) column-major
    out = _call(qa.codes.view(torch.uint8), codes_b, _row_group_scales(qa.scales, offs), _batch_scales(qb),
                qa.tensor_scales, qb.tensor_scales, nvfp4, offs)
    return zero_unwritten(out, offs, "2d3d")


def wgrad_native(a: Operand, b: Operand, ends: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """The (E, M, N) bf16 experts wgrad (2d x 2d) of K-grouped ``a`` (M, KP) and ``b`` (N, KP) (padded ends
    ``ends``; ``offs`` the groups' own ends), an empty group's gradient zero."""
    ends = held_ends(ends, a.k)  # a new tensor, within the columns whatever the model's offsets
    ends[-1:].fill_(a.k)  # the last group takes the trailing zero columns: the offsets end at KP (a fill, no copy)
    block = a.fmt.block_size
    scales = [_k_group_scales(op.scales, ends // block) for op in (a, b)]
    out = _call(a.codes.view(torch.uint8), b.codes.view(torch.uint8).t(), *scales, a.tensor_scale, b.tensor_scale,
                a.kind == KIND_NVFP4, ends)
    return zero_unwritten(out, offs, "2d2d")
