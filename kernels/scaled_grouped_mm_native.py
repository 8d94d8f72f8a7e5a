"""Blackwell's native grouped block-scaled GEMM (sm_100 and later) for experts' fprop and dgrad:
``torch.nn.functional.scaled_grouped_mm`` in the 2d x 3d layout, one launch for every expert.

The operands are the ones the per-group loop of ``grouped.grouped_mm`` quantizes (each expert's token group
and weight on their own), laid out as torch's contract for the grouped kernel asks (pytorch's
``GroupedBlas.cpp``: its block-scale checks and the MSLK grouped kernels it calls, as read on 2026-12-04):

- A: the groups' codes stacked in token order, (T, K) row-major (packed ``float4_e2m1fn_x2`` (T, K/2) for
  NVFP4). Its block scales: each group's (rows, K/block) scales in ``SWIZZLE_32_4_4``, zero-padded to whole
  128-row tiles, stacked in group order as one 2D (sum of padded rows, K/block rounded up to 4) tensor.
- B: each expert's (N, K) codes stacked to (E, N, K) and viewed (E, K, N), column-major; its scales one
  swizzled row per expert, (E, padded N x padded K/block).
- NVFP4 also takes one FP32 tensor scale per group for each operand (``TensorWise`` with E values); the
  kernel multiplies a group's accumulator by the product of its two.
- ``offs``: int32 cumulative group ends. The output is bf16 (the only type the grouped kernels write); rows
  past the last offset are zeros, as in the per-group loop.

An expert with no tokens has no A rows; its B slot holds zero codes and scales. Equal to the per-group loop
up to fp32 accumulation order. Not run on a Blackwell part yet: the tests check the arguments against the
contract above with a stand-in that decodes them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from autoprec.kernels.operand import KIND_NVFP4, Operand
from autoprec.kernels.scaled_mm_native import block_scales, native_problem

NATIVE_GROUPED_LAYOUT = "2d3d"


def grouped_native_problem(layout: str, a: Operand, b: Operand, out_dtype: torch.dtype) -> str | None:
    """Why the native grouped GEMM does not take a grouped product with operands like ``a`` and ``b`` (one
    group's; every group shares their formats, K and N), None when it does."""
    if layout != NATIVE_GROUPED_LAYOUT:
        return f"layout {layout} (the native grouped GEMM runs 2d x 3d: experts' fprop and dgrad)"
    if out_dtype != torch.bfloat16:
        return f"out_dtype {out_dtype} (the native grouped GEMM writes bfloat16)"
    if a.k == 0 or b.rows == 0:
        return "an empty operand"
    if torch.float8_e5m2 in (a.fmt.elem.torch_dtype, b.fmt.elem.torch_dtype):
        return "an E5M2 operand (the native grouped GEMM takes E4M3 codes)"
    return native_problem(a, b)


def _padded_scales(op: Operand) -> torch.Tensor:
    """One group's swizzled block scales as the 2D (padded rows, padded blocks) slab the kernel reads."""
    return block_scales(op).view(-1, -(-op.k // op.fmt.block_size // 4) * 4)


def scaled_grouped_mm_native(a_parts: list[Operand | None], b_parts: list[Operand | None], offs: torch.Tensor,
                             total_rows: int) -> torch.Tensor:
    """The (total_rows, N) bf16 grouped product of group operands ``a_parts`` (token rows of group g, None
    for an empty group) and ``b_parts`` (expert g's weight as (N, K), None where the group is empty), with
    ``offs`` the groups' cumulative ends (``grouped_native_problem`` is None for them)."""
    like_a = next(op for op in a_parts if op is not None)
    like_b = next(op for op in b_parts if op is not None)
    nvfp4 = like_a.kind == KIND_NVFP4
    codes_a = torch.cat([op.codes for op in a_parts if op is not None])
    scales_a = torch.cat([_padded_scales(op) for op in a_parts if op is not None])
    codes_b = torch.stack([op.codes if op is not None else torch.zeros_like(like_b.codes) for op in b_parts])
    scales_b = torch.stack([block_scales(op) if op is not None else torch.zeros_like(block_scales(like_b))
                            for op in b_parts])
    codes_a, codes_b = codes_a.view(torch.uint8), codes_b.view(torch.uint8).transpose(1, 2)
    swizzled = F.SwizzleType.SWIZZLE_32_4_4
    if nvfp4:
        def tensor_scales(parts: list[Operand | None]) -> torch.Tensor:
            one = torch.ones(1, dtype=torch.float32, device=like_a.codes.device)
            return torch.cat([one if op is None else op.tensor_scale.float().reshape(1) for op in parts])

        codes_a, codes_b = codes_a.view(torch.float4_e2m1fn_x2), codes_b.view(torch.float4_e2m1fn_x2)
        scale_a, scale_b = [scales_a, tensor_scales(a_parts)], [scales_b, tensor_scales(b_parts)]
        recipe = [F.ScalingType.BlockWise1x16, F.ScalingType.TensorWise]
        swizzle = [swizzled, F.SwizzleType.NO_SWIZZLE]
    else:
        codes_a, codes_b = codes_a.view(like_a.codes.dtype), codes_b.view(like_b.codes.dtype)
        scale_a, scale_b = scales_a, scales_b
        recipe, swizzle = F.ScalingType.BlockWise1x32, swizzled
    y = F.scaled_grouped_mm(codes_a, codes_b, scale_a, recipe, scale_b, recipe, swizzle, swizzle,
                            offs=offs.to(torch.int32), output_dtype=torch.bfloat16)
    return F.pad(y, (0, 0, 0, total_rows - y.shape[0]))
