"""Blackwell's native block-scaled matmul (sm_100 and later): cuBLAS through ``torch.nn.functional.scaled_mm``.

MXFP8 operands go as FP8 codes with E8M0 scales (``ScalingType.BlockWise1x32``), NVFP4 operands as packed
``float4_e2m1fn_x2`` codes with E4M3 block scales (``BlockWise1x16``) and the FP32 tensor scale
(``TensorWise``: cuBLAS multiplies the accumulator by the product of the two). Block scales go in the
``SWIZZLE_32_4_4`` layout (``swizzle.swizzle_scales``); a 16x16-tiled NVFP4 weight's tile scales are given to
every row of their tile, which is the same product. A is row-major, B column-major (the (N, K) storage
transposed). The GEMM writes fp32 without bias (torch's rule for an fp32 output); the bias is added in fp32
and the result rounded once, as the reference does. It equals the reference up to fp32 accumulation order.

Not run on a Blackwell part yet: the tests check the arguments against torch's documented contract (dtypes,
layouts, scale sizes and swizzle) with a stand-in that decodes them, and against torch's own checks of
``torch._scaled_mm_v2`` (its meta function) on fake CUDA tensors.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.operand import KIND_BF16, KIND_NVFP4, Operand
from .swizzle import swizzle_scales

NATIVE_CAPABILITY = (10, 0)


def native_problem(a: Operand, b: Operand) -> str | None:
    """Why cuBLAS's block-scaled GEMM does not take these operands (None when it does)."""
    if KIND_BF16 in (a.kind, b.kind):
        return "a BF16 operand (the native GEMM multiplies two quantized operands)"
    if (a.kind == KIND_NVFP4) != (b.kind == KIND_NVFP4):
        return f"{a.fmt.name} times {b.fmt.name} (the native GEMM takes one recipe for both operands)"
    if a.fmt.elem.torch_dtype == b.fmt.elem.torch_dtype == torch.float8_e5m2:
        return "two E5M2 operands (cuBLAS multiplies at most one)"
    if a.k % 32:
        return f"K={a.k} is not a multiple of 32 (16-byte rows of packed codes)"
    if b.rows % 16:
        return f"N={b.rows} is not a multiple of 16 (torch.nn.functional.scaled_mm's rule)"
    return None


def row_scales(scales: torch.Tensor, tile_rows: int, rows: int) -> torch.Tensor:
    """uint8 block scales (..., rows or row tiles, blocks) with one row per operand row: a 16x16 tile's scale given
    to each of its rows."""
    scales = scales.view(torch.uint8)
    return scales if tile_rows == 1 else scales.repeat_interleave(tile_rows, -2).narrow(-2, 0, rows)


def block_scales(op: Operand) -> torch.Tensor:
    """One scale per row and block of ``op``, swizzled, in the dtype cuBLAS reads."""
    dtype = torch.float8_e4m3fn if op.kind == KIND_NVFP4 else torch.float8_e8m0fnu
    return swizzle_scales(row_scales(op.scales, op.tile_rows, op.rows)).view(dtype)


def scaled_mm_native(a: Operand, b: Operand, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """(M, K) · (N, K)ᵀ -> (M, N) in ``out_dtype`` on Blackwell's block-scaled tensor cores; ``native_problem``
    is None for these operands."""
    swizzled = F.SwizzleType.SWIZZLE_32_4_4
    if a.kind == KIND_NVFP4:
        codes = [op.codes.view(torch.uint8).view(torch.float4_e2m1fn_x2) for op in (a, b)]
        scales = [[block_scales(op), op.tensor_scale.float().reshape(1)] for op in (a, b)]
        recipe = [F.ScalingType.BlockWise1x16, F.ScalingType.TensorWise]
        swizzle = [swizzled, F.SwizzleType.NO_SWIZZLE]
    else:
        codes = [a.codes, b.codes]
        scales = [block_scales(a), block_scales(b)]
        recipe, swizzle = F.ScalingType.BlockWise1x32, swizzled
    y = F.scaled_mm(codes[0], codes[1].t(), scales[0], recipe, scales[1], recipe, swizzle, swizzle,
                    output_dtype=torch.float32)
    return (y if bias is None else y + bias.float()).to(out_dtype)
