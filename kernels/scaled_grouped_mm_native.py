"""Blackwell's native grouped block-scaled GEMM (sm_100 and later) for experts: ``torch.nn.functional.
scaled_grouped_mm`` in one launch for every expert, 2d x 3d (fprop, dgrad) and 2d x 2d (wgrad).

The operands are the ones the per-group loop of ``grouped.grouped_mm`` quantizes (each expert's token group
and weight on their own), laid out as torch's contract for the grouped kernels asks (pytorch's
``GroupedBlas.cpp``, its block-scale checks and the MSLK grouped kernels it calls, and torchao's MoE scale
layouts, as read on 2026-12-04). A is row-major, B column-major; codes are FP8 E4M3 or packed
``float4_e2m1fn_x2``; block scales are each group's scales in ``SWIZZLE_32_4_4`` (``block_scales``), placed one
group after the other:

- 2d x 3d: A stacks the groups' token rows, (T, K); its scales are each group's (rows, K/block) slab padded to
  whole 128-row tiles, stacked as one 2D (sum of padded rows, K/block rounded up to 4) tensor. B is each
  expert's (N, K) codes stacked to (E, N, K) and viewed (E, K, N); its scales one swizzled row per expert.
  An expert with no tokens has no A rows, and zero codes and scales in B. Rows past the last offset are zeros.
- 2d x 2d: groups run along the reduction (tokens), so A (M, T) and B (T, N) join the groups' codes along T
  and their scales chunk after chunk: each group's (M or N, T_g/block) scales swizzled as a whole, (padded
  M or N, sum of each group's blocks rounded up to 4). Every group's size is a multiple of 32 (no group
  ends inside a block or a byte). An expert with no tokens gets a zero gradient.
- NVFP4 also takes one FP32 tensor scale per group for each operand (``TensorWise`` with E values, 1 for an
  empty group); the kernel multiplies a group's accumulator by the product of its two.
- ``offs``: int32 cumulative group ends; the output is bf16, the only type the grouped kernels write.

Equal to the per-group loop up to fp32 accumulation order. Not run on a Blackwell part yet: the tests check
the arguments against the contract above with a stand-in that decodes them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from autoprec.kernels.operand import KIND_NVFP4, Operand
from autoprec.kernels.scaled_mm_native import block_scales, native_problem

GROUP_MULTIPLE = 32  # a 2d x 2d group's tokens: whole MXFP8 blocks and 16-byte runs of NVFP4 codes


def grouped_native_problem(layout: str, a: Operand, b: Operand, out_dtype: torch.dtype,
                           group_sizes: list[int]) -> str | None:
    """Why the native grouped GEMM does not take a grouped product with operands like ``a`` and ``b`` (one
    group's; every group shares their formats and the dims not grouped) and groups of ``group_sizes`` tokens,
    None when it does."""
    if layout not in ("2d3d", "2d2d"):
        return f"layout {layout} (the native grouped GEMM runs 2d x 3d and 2d x 2d)"
    if out_dtype != torch.bfloat16:
        return f"out_dtype {out_dtype} (the native grouped GEMM writes bfloat16)"
    if a.rows == 0 or b.rows == 0:
        return "an empty operand"
    if torch.float8_e5m2 in (a.fmt.elem.torch_dtype, b.fmt.elem.torch_dtype):
        return "an E5M2 operand (the native grouped GEMM takes E4M3 codes)"
    if layout == "2d2d" and (odd := [n for n in group_sizes if n % GROUP_MULTIPLE]):
        return f"token groups of {odd[0]} (2d x 2d groups must be multiples of {GROUP_MULTIPLE} tokens)"
    return native_problem(a, b)


def _padded_scales(op: Operand) -> torch.Tensor:
    """One group's swizzled block scales as the 2D (padded rows, padded blocks) slab the kernel reads."""
    return block_scales(op).view(-1, -(-op.k // op.fmt.block_size // 4) * 4)


def _stacked_operands(layout: str, a_parts: list[Operand | None], b_parts: list[Operand | None]):
    """(A codes, A block scales, B codes, B block scales) of the groups, as uint8, laid out for the layout."""
    a_ops = [op for op in a_parts if op is not None]
    b_ops = [op for op in b_parts if op is not None]
    if layout == "2d2d":  # groups joined along the reduction; chunk after chunk of swizzled scales
        rows = (-(-a_ops[0].rows // 128) * 128, -(-b_ops[0].rows // 128) * 128)
        return (torch.cat([op.codes.view(torch.uint8) for op in a_ops], 1),
                torch.cat([block_scales(op).view(torch.uint8) for op in a_ops]).view(rows[0], -1),
                torch.cat([op.codes.view(torch.uint8) for op in b_ops], 1).t(),
                torch.cat([block_scales(op).view(torch.uint8) for op in b_ops]).view(rows[1], -1))
    # an expert with no tokens: zero codes and scales shaped like the others' (each swizzled once)
    codes_b = [None if op is None else op.codes.view(torch.uint8) for op in b_parts]
    scales_b = [None if op is None else block_scales(op).view(torch.uint8) for op in b_parts]
    some = next(i for i, c in enumerate(codes_b) if c is not None)
    return (torch.cat([op.codes.view(torch.uint8) for op in a_ops]),
            torch.cat([_padded_scales(op).view(torch.uint8) for op in a_ops]),
            torch.stack([torch.zeros_like(codes_b[some]) if c is None else c for c in codes_b]).transpose(1, 2),
            torch.stack([torch.zeros_like(scales_b[some]) if t is None else t for t in scales_b]))


def scaled_grouped_mm_native(layout: str, a_parts: list[Operand | None], b_parts: list[Operand | None],
                             offs: torch.Tensor, out_shape: tuple[int, ...]) -> torch.Tensor:
    """The bf16 grouped product, of shape ``out_shape``, of group g's operands ``a_parts[g]`` (its token rows
    for 2d x 3d, its token columns for 2d x 2d) and ``b_parts[g]`` (expert g's (N, K) weight, or the group's
    (N, tokens) gradient), None for an empty group, with ``offs`` the groups' cumulative ends
    (``grouped_native_problem`` is None for them)."""
    like = next(op for op in a_parts if op is not None)
    codes_a, scales_a, codes_b, scales_b = _stacked_operands(layout, a_parts, b_parts)
    swizzled = F.SwizzleType.SWIZZLE_32_4_4
    if like.kind == KIND_NVFP4:
        def tensor_scales(parts: list[Operand | None]) -> torch.Tensor:
            one = torch.ones(1, dtype=torch.float32, device=like.codes.device)
            return torch.cat([one if op is None else op.tensor_scale.float().reshape(1) for op in parts])

        codes_a, codes_b = codes_a.view(torch.float4_e2m1fn_x2), codes_b.view(torch.float4_e2m1fn_x2)
        scale_a = [scales_a.view(torch.float8_e4m3fn), tensor_scales(a_parts)]
        scale_b = [scales_b.view(torch.float8_e4m3fn), tensor_scales(b_parts)]
        recipe = [F.ScalingType.BlockWise1x16, F.ScalingType.TensorWise]
        swizzle = [swizzled, F.SwizzleType.NO_SWIZZLE]
    else:
        codes_a, codes_b = codes_a.view(like.codes.dtype), codes_b.view(like.codes.dtype)
        scale_a, scale_b = scales_a.view(torch.float8_e8m0fnu), scales_b.view(torch.float8_e8m0fnu)
        recipe, swizzle = F.ScalingType.BlockWise1x32, swizzled
    y = F.scaled_grouped_mm(codes_a, codes_b, scale_a, recipe, scale_b, recipe, swizzle, swizzle,
                            offs=offs.to(torch.int32), output_dtype=torch.bfloat16)
    if layout == "2d3d":
        return F.pad(y, (0, 0, 0, out_shape[0] - y.shape[0]))
    empty = [g for g, op in enumerate(a_parts) if op is None]
    return y.index_fill(0, torch.tensor(empty, device=y.device), 0.0) if empty else y
