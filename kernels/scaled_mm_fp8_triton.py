"""MXFP8 x MXFP8 on FP8 tensor cores (sm_90 ``wgmma`` e4m3/e5m2, sm_100 ``tcgen05``): C = A · Bᵀ.

Per 32-wide K chunk (one E8M0 scale per row of each operand) the raw FP8 codes go straight into an FP8
``tl.dot`` accumulating in fp32, and the chunk's partial sums are multiplied by the rows' and columns'
scales (powers of two: exact within fp32's range) before joining the fp32 accumulator, as DeepSeek-V3
promotes FP8 partial sums out of the tensor cores. Each product of two FP8 values is exact in fp32, so the
result equals the reference up to fp32 accumulation order, with no bf16 range limit on the scales (which
``scaled_mm_tc_triton`` has). On Hopper the FP8 MMA rate is twice bf16's; what the per-chunk scaling costs
on the CUDA cores is for ``benchmarks/kernels_gpu.py`` to measure, so dispatch uses this kernel only for
MXFP8 pairs whose scales leave bf16's exact range (else the fp32 kernel would run) until GPU numbers decide.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from autoprec.kernels.numerics_triton import decode_e8m0, decode_float8
from autoprec.kernels.operand import KIND_MXFP8, Operand
from autoprec.kernels.scaled_mm_triton import store_tile

BLOCK_M = 128
BLOCK_N = 64  # 128 spills registers on sm_90 and sm_100 (the partial sums and the accumulator both live)
CHUNK = 32  # the MXFP8 block: one scale per row per chunk
NUM_WARPS = 8
NUM_STAGES = 4


def fp8_dot_problem(a: Operand, b: Operand) -> str | None:
    """Why the FP8 dot does not take these operands (None when it does)."""
    if a.kind != KIND_MXFP8 or b.kind != KIND_MXFP8:
        return f"{a.fmt.name} times {b.fmt.name} (the FP8 dot multiplies two MXFP8 operands)"
    if a.fmt.elem.torch_dtype == b.fmt.elem.torch_dtype == torch.float8_e5m2:
        return "two E5M2 operands (FP8 MMAs take at most one)"
    return None


@triton.jit
def fp8_tile(codes_ptr, rows, kk, R, K, E5M2: tl.constexpr, IN_FP32: tl.constexpr):
    """A [len(rows), 32] tile of FP8 codes as the dot takes it: FP8 for the tensor cores, or (the interpreter,
    which has no FP8 dot) their exact fp32 values."""
    mask = (rows < R)[:, None] & (kk < K)[None, :]
    c = tl.load(codes_ptr + rows[:, None] * K + kk[None, :], mask=mask, other=0)
    if IN_FP32:
        if E5M2:
            tile = decode_float8(c, 5, 2, 15, True)
        else:
            tile = decode_float8(c, 4, 3, 7, False)
    elif E5M2:
        tile = c.to(tl.float8e5, bitcast=True)
    else:
        tile = c.to(tl.float8e4nv, bitcast=True)
    return tile


@triton.jit
def fp8_gemm_kernel(a_codes, a_scales, b_codes, b_scales, bias_ptr, out_ptr, M, N, K,
                    A_E5M2: tl.constexpr, B_E5M2: tl.constexpr, HAS_BIAS: tl.constexpr, OUT_BF16: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, IN_FP32: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, 32):
        kk = k0 + tl.arange(0, 32)
        a = fp8_tile(a_codes, rm, kk, M, K, A_E5M2, IN_FP32)
        b = fp8_tile(b_codes, rn, kk, N, K, B_E5M2, IN_FP32)
        if IN_FP32:
            part = tl.dot(a, tl.trans(b), input_precision="ieee")
        else:
            part = tl.dot(a, tl.trans(b), out_dtype=tl.float32)
        sa = decode_e8m0(tl.load(a_scales + rm * (K // 32) + k0 // 32, mask=rm < M, other=127))
        sb = decode_e8m0(tl.load(b_scales + rn * (K // 32) + k0 // 32, mask=rn < N, other=127))
        acc += part * sa[:, None] * sb[None, :]
    store_tile(acc, bias_ptr, out_ptr, rm, rn, M, N, HAS_BIAS, OUT_BF16)


def scaled_mm_fp8_triton(a: Operand, b: Operand, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """(M, K) · (N, K)ᵀ -> (M, N) in ``out_dtype`` (float32 or bfloat16); ``fp8_dot_problem`` is None."""
    m, k, n = a.rows, a.k, b.rows
    out = torch.empty(m, n, device=a.codes.device, dtype=out_dtype)
    codes = [op.codes.view(torch.uint8) for op in (a, b)]
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    fp8_gemm_kernel[grid](
        codes[0], a.scales, codes[1], b.scales, bias if bias is not None else out,
        out.view(torch.int16) if out_dtype == torch.bfloat16 else out, m, n, k,
        A_E5M2=a.fmt.elem.torch_dtype == torch.float8_e5m2, B_E5M2=b.fmt.elem.torch_dtype == torch.float8_e5m2,
        HAS_BIAS=bias is not None, OUT_BF16=out_dtype == torch.bfloat16, BM=BLOCK_M, BN=BLOCK_N,
        IN_FP32=os.environ.get("TRITON_INTERPRET") == "1", num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return out
