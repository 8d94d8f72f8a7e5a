"""Tensor-core block-scaled matmul for GPUs without block-scaled MMA (sm_90, Hopper): C = A · Bᵀ.

Each tile of codes is decoded in registers to bfloat16 — ``code · block scale`` with NVFP4's tensor scale
left out — and multiplied with a bf16 ``tl.dot`` (``wgmma`` on sm_90) accumulating in fp32; the two NVFP4
tensor scales multiply the fp32 accumulator once at the end, then bias and the output cast. The decode is
exact: an E2M1 value times an E4M3 scale has at most 6 significant bits and lies in [2^-10, 2688], and an
E4M3 / E5M2 element times an E8M0 scale is a bf16 number while the scale exponent keeps it in bf16's
normal range (``exact_decode_problem`` checks that on the host; the fp32 kernel takes the rest). The
result equals the reference up to fp32 accumulation order.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from autoprec.kernels.operand import Operand
from autoprec.kernels.scaled_mm_triton import apply_tensor_scales, decode_tile, launch, store_tile

BLOCK_M = 128
BLOCK_N = 128
BLOCK_K = 32  # 64 spills registers on sm_90 (decode of two 128x64 tiles in flight)
NUM_WARPS = 8
NUM_STAGES = 3
E8M0_BIAS = 127


@triton.jit
def scaled_mm_tc_kernel(
    a_codes, a_scales, a_ts, b_codes, b_scales, b_ts, bias_ptr, out_ptr, M, N, K,
    A_KIND: tl.constexpr, A_EBITS: tl.constexpr, A_MBITS: tl.constexpr, A_BIAS: tl.constexpr, A_INF: tl.constexpr,
    B_KIND: tl.constexpr, B_EBITS: tl.constexpr, B_MBITS: tl.constexpr, B_BIAS: tl.constexpr, B_INF: tl.constexpr,
    B_TILE_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, OUT_BF16: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, INTERPRETED: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        a = decode_tile(a_codes, a_scales, rm, kk, M, K, A_KIND, A_EBITS, A_MBITS, A_BIAS, A_INF, 1).to(tl.bfloat16)
        b = decode_tile(b_codes, b_scales, rn, kk, N, K, B_KIND, B_EBITS, B_MBITS, B_BIAS, B_INF,
                        B_TILE_ROWS).to(tl.bfloat16)
        if INTERPRETED:  # the interpreter's dot reads bf16 as integers: the same exact values, in fp32
            acc += tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.float32)
    acc = apply_tensor_scales(acc, a_ts, b_ts, A_KIND, B_KIND)
    store_tile(acc, bias_ptr, out_ptr, rm, rn, M, N, HAS_BIAS, OUT_BF16)


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
                f"{lo}..{hi}: decoded in fp32 instead")
    return None


def scaled_mm_tc_triton(a: Operand, b: Operand, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """(M, K) · (N, K)ᵀ -> (M, N) in ``out_dtype`` on tensor cores; operands already checked, and
    ``exact_decode_problem`` is None for both."""
    return launch(scaled_mm_tc_kernel, (BLOCK_M, BLOCK_N, BLOCK_K), a, b, bias, out_dtype,
                  INTERPRETED=os.environ.get("TRITON_INTERPRET") == "1", num_warps=NUM_WARPS, num_stages=NUM_STAGES)
