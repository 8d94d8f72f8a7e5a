"""Hopper's FP8 block-scaled GEMM (sm_90): cuBLAS's blockwise scaling through ``torch.nn.functional.scaled_mm``.

FP8-block operands go as E4M3 codes with their fp32 scales: 1x128 blocks as ``ScalingType.BlockWise1x128``, a
weight's 128x128 tiles as ``BlockWise128x128`` (one operand at most: cuBLAS takes 1x128·1x128, 1x128·128x128 and
128x128·1x128). A is row-major, B column-major (the (N, K) storage transposed). Scales go outer-dim-major as torch
requires: a 1x128 operand's (rows, K/128) scales with stride (1, rows), a tiled operand's (rows/128, K/128) tile
scales padded to a multiple of 4 tiles along K and transposed. The GEMM writes fp32 without bias; the bias is added
in fp32 and the result rounded once, as the reference does, so it equals the reference up to fp32 accumulation
order (cuBLAS promotes the FP8 tensor cores' partial sums into fp32 every 128 values of K, where the scales change).

Not run on a GPU yet: the tests check the arguments against torch's own checks of ``torch._scaled_mm_v2`` (its
meta function) on fake CUDA tensors, and the product they describe with a stand-in that decodes them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from autoprec.formats import FP8_BLOCK

from ..core.operand import Operand

BLOCKWISE_CAPABILITY = (9, 0)
MIN_CUDA = (12, 9)  # cuBLAS's blockwise scaling


def blockwise_problem(capability: tuple[int, int] | None, a: Operand, b: Operand) -> str | None:
    """Why cuBLAS's blockwise GEMM does not run these operands on a GPU of ``capability`` (None when it does)."""
    if capability is None or tuple(capability)[0] != BLOCKWISE_CAPABILITY[0]:
        return "cuBLAS's blockwise FP8 GEMM runs on sm_90 only (not this device)"
    if a.fmt is not FP8_BLOCK or b.fmt is not FP8_BLOCK:
        return f"{a.fmt.name} times {b.fmt.name} (the blockwise GEMM multiplies two fp8_block operands)"
    if a.tile_rows > 1 and b.tile_rows > 1:
        return "two 128x128-tiled operands (cuBLAS takes one at most)"
    if b.rows % 16:
        return f"N={b.rows} is not a multiple of 16 (torch.nn.functional.scaled_mm's rule)"
    version = torch.version.cuda
    if version is None or tuple(int(v) for v in version.split(".")[:2]) < MIN_CUDA:
        return f"torch built with CUDA {version} (cuBLAS's blockwise scaling needs {'.'.join(map(str, MIN_CUDA))})"
    return None


def _scales(op: Operand) -> tuple[torch.Tensor, F.ScalingType]:
    """``op``'s fp32 scales in the layout and with the recipe torch's blockwise GEMM reads."""
    scales = op.scales.view(torch.float32)
    if op.tile_rows == 1:
        return scales.t().clone(memory_format=torch.contiguous_format).t(), F.ScalingType.BlockWise1x128
    k_tiles = scales.shape[1]
    padded = torch.nn.functional.pad(scales, (0, -k_tiles % 4), value=1.0)
    return padded.t(), F.ScalingType.BlockWise128x128


def scaled_mm_blockwise(a: Operand, b: Operand, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """(M, K) · (N, K)ᵀ -> (M, N) in ``out_dtype`` on Hopper's FP8 tensor cores; ``blockwise_problem`` is None for
    these operands."""
    (scale_a, recipe_a), (scale_b, recipe_b) = _scales(a), _scales(b)
    codes_a = a.codes.view(torch.float8_e4m3fn)
    codes_b = b.codes.view(torch.float8_e4m3fn)
    y = F.scaled_mm(codes_a, codes_b.t(), scale_a, recipe_a, scale_b, recipe_b, output_dtype=torch.float32)
    return (y if bias is None else y + bias.float()).to(out_dtype)
