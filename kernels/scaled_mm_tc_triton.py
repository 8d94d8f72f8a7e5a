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

from autoprec.kernels.numerics_triton import decode_e2m1, decode_e8m0, decode_float8
from autoprec.kernels.operand import Operand
from autoprec.kernels.scaled_mm_triton import launch, store_tile

BLOCK_M = 128
BLOCK_N = 128
BLOCK_K = 32  # 64 spills registers on sm_90 (decode of two 128x64 tiles in flight)
NUM_WARPS = 8
NUM_STAGES = 3
E8M0_BIAS = 127


@triton.jit
def _bf16_tile(codes_ptr, scales_ptr, rows, kk, R, K,
               KIND: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
               HAS_INF: tl.constexpr, TILE_ROWS: tl.constexpr):
    """bf16 [len(rows), len(kk)] tile of one operand (0 = NVFP4 without its tensor scale, 1 = MXFP8, 2 = BF16)."""
    mask = (rows < R)[:, None] & (kk < K)[None, :]
    if KIND == 2:
        return tl.load(codes_ptr + rows[:, None] * K + kk[None, :], mask=mask, other=0.0)
    if KIND == 0:
        byte = tl.load(codes_ptr + rows[:, None] * (K // 2) + kk[None, :] // 2, mask=mask, other=0)
        nib = tl.where((kk % 2 == 0)[None, :], byte & 0xF, byte >> 4)
        s = tl.load(scales_ptr + (rows // TILE_ROWS)[:, None] * (K // 16) + kk[None, :] // 16, mask=mask, other=0)
        return (decode_e2m1(nib) * decode_float8(s, 4, 3, 7, False)).to(tl.bfloat16)
    c = tl.load(codes_ptr + rows[:, None] * K + kk[None, :], mask=mask, other=0)
    s = tl.load(scales_ptr + rows[:, None] * (K // 32) + kk[None, :] // 32, mask=mask, other=127)
    return (decode_float8(c, EBITS, MBITS, BIAS, HAS_INF) * decode_e8m0(s)).to(tl.bfloat16)


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
        a = _bf16_tile(a_codes, a_scales, rm, kk, M, K, A_KIND, A_EBITS, A_MBITS, A_BIAS, A_INF, 1)
        b = _bf16_tile(b_codes, b_scales, rn, kk, N, K, B_KIND, B_EBITS, B_MBITS, B_BIAS, B_INF, B_TILE_ROWS)
        if INTERPRETED:  # the interpreter's dot reads bf16 as integers: the same exact values, in fp32
            acc += tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.float32)
    if A_KIND == 0:
        acc = acc * tl.load(a_ts)
    if B_KIND == 0:
        acc = acc * tl.load(b_ts)
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
