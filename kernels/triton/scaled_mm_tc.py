"""Tensor-core block-scaled matmul for GPUs without block-scaled MMA (sm_90, Hopper): C = A · Bᵀ.

It runs ``scaled_mm_triton``'s kernel with its bf16 dot: each tile of codes is decoded in registers to
bfloat16 — ``code · block scale`` with NVFP4's tensor scale left out — and multiplied with a bf16
``tl.dot`` (``wgmma`` on sm_90) accumulating in fp32; the two NVFP4 tensor scales multiply the fp32
accumulator once at the end, then bias and the output cast. The decode is exact: an E2M1 value times an
E4M3 scale has at most 6 significant bits and lies in [2^-10, 2688], and an E4M3 / E5M2 element times an
E8M0 scale is a bf16 number while the scale exponent keeps it in bf16's normal range
(``exact_decode_problem`` checks that on the host; the fp32 dot takes the rest). The result
equals the reference up to fp32 accumulation order.
"""
from __future__ import annotations

import torch

from ..core.operand import Operand
from .scaled_mm import bf16_dot, launch

BLOCK_M = 128
BLOCK_N = 128
BLOCK_K = 32  # 64 spills registers on sm_90 (decode of two 128x64 tiles in flight)
NUM_WARPS = 8
NUM_STAGES = 3
E8M0_BIAS = 127


def exact_decode_problem(op: Operand) -> str | None:
    """Why an operand's tiles would not decode to bf16 exactly (None when they do): MXFP8 scales whose
    exponent takes element values below bf16's normal range or past its max."""
    if op.kind != 1:
        return None
    elem = op.fmt.elem
    lowest = 1 - elem.bias - elem.mbits  # exponent of the smallest subnormal element
    lo, hi = -126 - lowest, 127 - elem.emax
    codes = op.scales.view(torch.uint8)
    if codes.numel() == 0:
        return None
    e = codes.to(torch.int32) - E8M0_BIAS
    e = e[codes != 255]  # NaN blocks decode to NaN either way
    if e.numel() and (int(e.min()) < lo or int(e.max()) > hi):
        return (f"{op.fmt.name} scale exponents {int(e.min())}..{int(e.max())} leave bf16's exact range "
                f"{lo}..{hi}")
    return None


def scaled_mm_tc_triton(a: Operand, b: Operand, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """(M, K) · (N, K)ᵀ -> (M, N) in ``out_dtype`` on tensor cores; operands already checked, and
    ``exact_decode_problem`` is None for both."""
    return launch((BLOCK_M, BLOCK_N, BLOCK_K), a, b, bias, out_dtype, bf16_dot(), num_warps=NUM_WARPS,
                  num_stages=NUM_STAGES)
