"""Triton's bf16 GEMM over decoded operands read by the Tensor Memory Accelerator (Hopper on): each tile of A and B
comes from a host tensor descriptor (``triton.tools.tensor_descriptor.TensorDescriptor``) in one bulk copy instead
of a load per thread, with the out-of-bounds rows and columns of a tile filled with zeros by the copy itself; the
epilogue (NVFP4's tensor scales, bias, one rounding) is ``scaled_mm_triton``'s, in registers.

A candidate for sm_90's decoded product beside cuBLAS's and the pointer-based Triton GEMM
(``scaled_mm_decoded``): ``benchmarks/kernels_gpu.py`` times it; dispatch does not take it until a GPU has.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ..core.launch import cdiv
from ..core.operand import Operand, decoded, kernel_args
from .scaled_mm import accumulate, apply_tensor_scales, bf16_dot, grouped_tile, store_tile

# the 128x256x64 tile of Triton's matmul tutorial for Hopper, turned: 128x256 spills on sm_90 with Triton 3.6 (torch
# 2.11's; 184 bytes of stack, none with 3.9), 256x128 takes 232 registers there and 224 with 3.9
TMA_BLOCKS, TMA_WARPS, TMA_STAGES = (256, 128, 64), 8, 3


@triton.jit
def tma_gemm_kernel(a_desc, b_desc, a_ts, b_ts, bias_ptr, out_ptr, M, N, K,
                    A_KIND: tl.constexpr, B_KIND: tl.constexpr, HAS_BIAS: tl.constexpr, OUT_BF16: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT: tl.constexpr):
    """One (BM, BN) output tile per program (``grouped_tile``'s order) of A (M, K) · B (N, K)ᵀ, A's (BM, BK) and B's
    (BN, BK) tiles loaded through their descriptors, the tensor scales of kinds 0 and 3, bias and the rounding applied
    to the fp32 accumulator."""
    m0, n0 = grouped_tile(tl.program_id(0), M, N, BM, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        acc = accumulate(acc, a_desc.load([m0, k0]), b_desc.load([n0, k0]), DOT)
    acc = apply_tensor_scales(acc, a_ts, b_ts, A_KIND, B_KIND)
    # from the tile's first row in int64: an (M, N) output (logits) may pass 2**31 elements
    store_tile(acc, bias_ptr, out_ptr + tl.cast(m0, tl.int64) * N, tl.arange(0, BM), n0 + tl.arange(0, BN), M - m0,
               N, HAS_BIAS, OUT_BF16)


def tma_gemm(a: Operand, b: Operand, da: torch.Tensor, db: torch.Tensor, bias: torch.Tensor | None,
             out_dtype: torch.dtype, *, blocks: tuple[int, int, int] = TMA_BLOCKS, num_warps: int = TMA_WARPS,
             num_stages: int = TMA_STAGES) -> torch.Tensor:
    """(M, K) · (N, K)ᵀ -> (M, N) in ``out_dtype`` of the bf16 values ``da`` and ``db`` that ``a`` and ``b`` decode
    to (row-major, K a multiple of 8: the descriptors' 16-byte strides), with ``a``'s and ``b``'s NVFP4 tensor
    scales, ``bias`` and one rounding; ``blocks`` is (BM, BN, BK)."""
    bm, bn, bk = blocks
    (a_vals, _, a_ts), (a_kind, *_) = kernel_args(decoded(a, da))
    (b_vals, _, b_ts), (b_kind, *_) = kernel_args(decoded(b, db))
    m, k = a_vals.shape
    n = b_vals.shape[0]
    out = torch.empty(m, n, device=da.device, dtype=out_dtype)
    tma_gemm_kernel[(cdiv(m, bm) * cdiv(n, bn),)](
        TensorDescriptor.from_tensor(a_vals, [bm, bk]), TensorDescriptor.from_tensor(b_vals, [bn, bk]), a_ts, b_ts,
        bias if bias is not None else out, out.view(torch.int16) if out_dtype == torch.bfloat16 else out, m, n, k,
        A_KIND=a_kind, B_KIND=b_kind, HAS_BIAS=bias is not None, OUT_BF16=out_dtype == torch.bfloat16, BM=bm, BN=bn,
        BK=bk, DOT=bf16_dot(), num_warps=num_warps, num_stages=num_stages)
    return out
