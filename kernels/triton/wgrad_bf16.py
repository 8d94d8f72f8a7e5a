"""The unquantized experts' wgrad (2d x 2d: C_g = A_g · B_g, reduced over group g's tokens) in one Triton launch,
reading both operands where they lie: A (M, T) and B (T, N) of any strides (the wgrad's A is usually the token
rows transposed, unit stride along M), each group's K loop over its own tokens with the tile columns past its end
masked to zero. No gather, no padding: the quantized wgrad pads each group to whole blocks for its scales, a bf16
one has no blocks to keep. fp32 accumulation, one rounding to the output dtype; an empty group's product is zero.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..core.launch import cdiv
from .grouped_mm import BF16_BLOCKS, BF16_OPTIONS, bf16_dot, store_view
from .scaled_mm import accumulate, store_tile


@triton.jit
def bf16_wgrad_kernel(a_ptr, b_ptr, offs_ptr, out_ptr, M, N, T, s_am, s_at, s_bt, s_bn, OUT_BF16: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT: tl.constexpr):
    """Output tile (program ids 0, 1) of group ``program_id(2)``'s (M, N) product over its tokens, the cumulative
    ends at ``offs_ptr`` held to 0 .. T (offsets out of range or decreasing read no token past the operands)."""
    g = tl.program_id(2)
    m0, n0 = tl.program_id(0) * BM, tl.program_id(1) * BN
    end = tl.minimum(tl.maximum(tl.load(offs_ptr + g), 0), T)
    start = tl.minimum(tl.maximum(tl.load(offs_ptr + g - 1, mask=g > 0, other=0), 0), end)
    lm, ln, lk = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, BK)
    a_rows = a_ptr + tl.cast(m0, tl.int64) * s_am + lm[:, None] * s_am  # rows and token offsets added apart:
    b_cols = b_ptr + tl.cast(n0, tl.int64) * s_bn + ln[:, None] * s_bn  # (M, T) may pass 2**31 elements
    m_in, n_in = (m0 + lm < M)[:, None], (n0 + ln < N)[:, None]
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(start, end, BK):
        k_in = (k0 + lk < end)[None, :]
        a = tl.load(a_rows + tl.cast(k0, tl.int64) * s_at + lk[None, :] * s_at, mask=m_in & k_in, other=0.0)
        b = tl.load(b_cols + tl.cast(k0, tl.int64) * s_bt + lk[None, :] * s_bt, mask=n_in & k_in, other=0.0)
        acc = accumulate(acc, a, b, DOT)  # acc + a · bᵀ: b's tile is (BN, BK)
    store_tile(acc, out_ptr, out_ptr + tl.cast(g, tl.int64) * M * N, m0 + lm, n0 + ln, M, N, False, OUT_BF16)


def bf16_wgrad(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """(E, M, N) products of bf16 ``a`` (M, T) and ``b`` (T, N) over the token groups ending at ``offs`` (E int32
    cumulative ends, read on the device), into ``out_dtype`` (float32 or bfloat16)."""
    (m, tokens), n, experts = a.shape, b.shape[1], offs.shape[0]
    out = torch.empty(experts, m, n, device=a.device, dtype=out_dtype)
    bm, bn, bk = BF16_BLOCKS
    bf16_wgrad_kernel[(cdiv(m, bm), cdiv(n, bn), experts)](
        a, b, offs, store_view(out), m, n, tokens, *a.stride(), *b.stride(), OUT_BF16=out_dtype == torch.bfloat16,
        BM=bm, BN=bn, BK=bk, DOT=bf16_dot(), **BF16_OPTIONS)
    return out
