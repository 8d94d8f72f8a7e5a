"""Triton helpers for the scales every quantizer computes: NVFP4's tensor and block scales, MXFP8's E8M0 block
exponents, and the exact atomic max the tensor amax is gathered with. Each replays its reference (``nvfp4_ref``,
``mxfp8_ref``) bit for bit."""
from __future__ import annotations

import triton
import triton.language as tl

from ..reference.nvfp4 import FP4_TIMES_FP8_MAX as _FP4_TIMES_FP8_MAX
from ..reference.nvfp4 import ONE_SIXTH as _ONE_SIXTH
from .numerics import (
    FLT_MAX,
    encode_float8,
    floor_log2,
    round_and_encode_fp8,
    round_to_element,
)

ONE_SIXTH = tl.constexpr(_ONE_SIXTH)  # fp32(1/6)
FP4_TIMES_FP8_MAX = tl.constexpr(_FP4_TIMES_FP8_MAX)  # 6 · 448
INF_BITS = tl.constexpr(0x7F800000)  # fp32 Inf's bits: |x|'s bits are at least this for Inf and NaN
# added to |x|'s bits, pushes Inf's and NaN's past int32's top (below zero) and keeps finite values' order: a signed
# max of the sums (at least FINITE_BIAS) less FINITE_BIAS is the finite values' amax, in one add per element (a
# column slice kernel's per-thread maxima; the row tiles' reductions across threads did not gain from it)
FINITE_BIAS = tl.constexpr(0x800000)


@triton.jit
def atomic_max_bits(ptr, amax):
    """Max of a non-negative fp32 into an int32 cell holding fp32 bits: such floats order as their bits do,
    so an integer atomic max is exact."""
    tl.atomic_max(ptr, amax.to(tl.int32, bitcast=True))


@triton.jit
def tensor_scales(amax):
    """NVFP4's (S_enc · fp32(1/6), S_dec = 1 / S_enc) of tensor amaxes ``amax`` (fp32, any shape), as
    ``nvfp4_encode_scale`` and ``scale_to_block`` compute them (IEEE division, one fp32 rounding each)."""
    s_enc = tl.minimum(tl.math.div_rn(tl.full(amax.shape, FP4_TIMES_FP8_MAX, tl.float32), amax), FLT_MAX)  # 0: Inf
    s_enc = tl.where(amax > 0, s_enc, 1.0)
    return s_enc * ONE_SIXTH, tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), s_enc)


@triton.jit
def nvfp4_block_scales(amax_bits, amax_ptr, amax_idx, ts_ptr, first, GROUPED: tl.constexpr, HW: tl.constexpr):
    """(s_b, e_b) of blocks whose |values|' largest fp32 bits are ``amax_bits`` (Inf or NaN: a NaN scale), under
    the tensor scales of the amax bits at ``amax_ptr + amax_idx``; unless GROUPED, the ``first`` tile stores the
    tensor's decode scale to ``ts_ptr``. With HW (a GPU converting fp32 to E4M3 in one instruction: sm_89 on) s_b
    is rounded by the hardware's saturating conversion, the reference's RNE and clamp at 448 (the product is never
    negative), and read back through its exact fp8 -> fp16 conversion (``e4m3_codes`` encodes s_b for the store)."""
    bad = amax_bits >= INF_BITS
    amax = amax_bits.to(tl.float32, bitcast=True)
    s_enc6, s_dec = tensor_scales(tl.load(amax_ptr + amax_idx).to(tl.float32, bitcast=True))
    if not GROUPED:
        if first:
            tl.store(ts_ptr, s_dec)
    if HW:
        s_b = (amax * s_enc6).to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.float32)
    else:
        s_b = round_to_element(amax * s_enc6, 0, 3, -6, 448.0, False)
    s_b = tl.where(bad, float("nan"), s_b)
    e_b = tl.math.div_rn(tl.full(s_b.shape, 1.0, tl.float32), s_b * s_dec)
    return s_b, tl.where(e_b > FLT_MAX, FLT_MAX, e_b)


@triton.jit
def e4m3_codes(s, HW: tl.constexpr):
    """uint8 codes of fp32 values on the E4M3 grid (NaN: 0x7F, torch's code): with HW (sm_89 on) by
    ``round_and_encode_fp8``'s hardware conversion (exact on the grid), else ``encode_float8``. Encoded where they
    are stored: encoded where the scales are computed, they stay live across the scales' division and the kernel
    grows."""
    if HW:
        return round_and_encode_fp8(s, 0, 4, 3, 7, 448.0, False, True).to(tl.uint8)
    return encode_float8(s, 4, 3, 7)


@triton.jit
def mxfp8_block_exponents(amax, EMAX: tl.constexpr, MAX: tl.constexpr, FLOOR: tl.constexpr):
    """The E8M0 exponents (int32, -127 .. 127) of blocks with finite amaxes ``amax``: RCEIL, or with FLOOR the
    OCP rule."""
    if FLOOR:
        e = tl.where(amax > 0, floor_log2(amax) - EMAX, -127)
    else:
        q = tl.math.div_rn(amax, tl.full(amax.shape, MAX, tl.float32))
        normal = floor_log2(q) + tl.where((q.to(tl.int32, bitcast=True) & 0x7FFFFF) != 0, 1, 0)
        tiny = tl.where(q > 5.877471754111438e-39, -126, -127)
        e = tl.where(q >= 1.1754943508222875e-38, normal, tiny)
    return tl.minimum(tl.maximum(e, -127), 127)
