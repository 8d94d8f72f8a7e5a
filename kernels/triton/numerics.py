"""Triton device helpers replaying ``rounding_ref`` bit for bit.

Floats are not cast down by Triton (the interpreter rounds those casts wrongly): values are rounded
with exact fp32 arithmetic and integer work on the fp32 bits, and 8-bit codes are assembled as
integers and stored as uint8. The exceptions run on GPUs alone: RNE by the hardware's fp8 and E2M1
conversions (``round_and_encode_fp8``, ``e2m1_pair``, and NVFP4's block scales in ``block_scales_triton``),
whose rounding is the reference's. Clamps use ``tl.where`` so NaN passes through as in torch (GPU
``min``/``max`` would drop it).
"""
from __future__ import annotations

import triton
import triton.language as tl

# tl.constexpr: compiled kernels may only read globals that are (the interpreter does not check this)
FLT_MAX = tl.constexpr(3.4028234663852886e38)
MAGIC_RNE = tl.constexpr(8388608.0)


@triton.jit
def floor_log2(a):
    """floor(log2 a) of positive fp32 from the exponent field (fp32 subnormals give -127)."""
    return ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def pow2(e):
    """Exact fp32 2**e for int32 e in [-126, 127]."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _rounded_significand(x, rand, MBITS: tl.constexpr, EMIN: tl.constexpr, MAX: tl.constexpr, SR: tl.constexpr,
                         AS_INT: tl.constexpr = False):
    """(x's bits, f, r): with |x| saturated at MAX and f = max(floor_log2 |x|, EMIN), r is |x| in units of
    2**(f - MBITS) rounded to an integer (RNE, or stochastic with the low 24 bits of ``rand``), as fp32, or with
    AS_INT as int32: RNE's then comes from the bits of the sum with 2**23 (r < 2**(MBITS + 1)), no conversion."""
    bits = x.to(tl.int32, bitcast=True)
    a = (bits & 0x7FFFFFFF).to(tl.float32, bitcast=True)
    a = tl.where(a > MAX, MAX, a)
    f = tl.maximum(floor_log2(a), EMIN)
    s = a * pow2(MBITS - f)
    if SR:
        lo = tl.floor(s)
        u = (rand & 0xFFFFFF).to(tl.float32) * 5.9604644775390625e-08  # 2**-24
        r = lo + tl.where(u < s - lo, 1.0, 0.0)  # FMA-safe: s = a·2**k is exact
        if AS_INT:
            r = r.to(tl.int32)
    else:
        if AS_INT:
            r = (s + MAGIC_RNE).to(tl.int32, bitcast=True) - 0x4B000000  # FMA-safe: s is exact
        else:
            r = (s + MAGIC_RNE) - MAGIC_RNE  # FMA-safe: s is exact
    return bits, f, r


@triton.jit
def round_to_element(x, rand, MBITS: tl.constexpr, EMIN: tl.constexpr, MAX: tl.constexpr, SR: tl.constexpr):
    """RNE (or, with SR, stochastic with the low 24 bits of ``rand``) onto a float grid, saturating."""
    bits, f, r = _rounded_significand(x, rand, MBITS, EMIN, MAX, SR)
    mag = (r * pow2(f - MBITS)).to(tl.int32, bitcast=True)
    out = (mag | ((bits >> 31) << 31)).to(tl.float32, bitcast=True)
    return tl.where(x != x, float("nan"), out)


@triton.jit
def round_and_encode(x, rand, EBITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, MAX: tl.constexpr,
                     SR: tl.constexpr, NAN_CODE: tl.constexpr):
    """The int32 element code ``round_to_element`` then encoding give (E2M1: EBITS 2; E4M3 / E5M2), in one pass:
    the magnitude code is r + ((f - EMIN) << MBITS) (``_rounded_significand``'s r and f): an r that rounds up
    to the next binade carries into the exponent field, and below EMIN it is a subnormal's mantissa. The sign
    is x's (so -0 keeps it); NaN gives NAN_CODE, or with a negative NAN_CODE any code: NVFP4's quantizers zero
    a non-finite block's codes themselves, one test per block instead of one per element (``e2m1_pair``)."""
    SIGN: tl.constexpr = EBITS + MBITS
    if EBITS == 2 and not SR:
        code = _e2m1_rne(x)
    else:
        bits, f, r = _rounded_significand(x, rand, MBITS, EMIN, MAX, SR, True)
        code = (r + ((f - EMIN) << MBITS)) | ((bits >> (31 - SIGN)) & (1 << SIGN))
    if NAN_CODE >= 0:
        code = tl.where(x != x, NAN_CODE, code)
    return code


@triton.jit
def _e2m1_rne(x):
    """``round_and_encode``'s E2M1 codes under RNE (NaN's left to the caller), with one magic add: for |x| clamped
    to 6 and k = max(floor_log2 |x|, 0) (0, 1 or 2), the ulp of 2**(22 + k) is E2M1's step 2**(k - 1) there, so
    |x| + 2**(22 + k) rounds |x| to that step (ties to even, the even E2M1 mantissa) and its low bits are n =
    round(|x| / 2**(k - 1)); the magnitude's code is n + 2k. A few instructions fewer than
    ``_rounded_significand``'s scaling."""
    bits = x.to(tl.int32, bitcast=True)
    a = tl.minimum((bits & 0x7FFFFFFF).to(tl.float32, bitcast=True), 6.0)
    k = tl.maximum((a.to(tl.int32, bitcast=True) >> 23) - 127, 0)
    magic = (k + 149) << 23  # 2**(22 + k)
    n = (a + magic.to(tl.float32, bitcast=True)).to(tl.int32, bitcast=True) - magic
    return (n + (k << 1)) | ((bits >> 28) & 8)


@triton.jit
def round_and_encode_fp8(x, rand, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, MAX: tl.constexpr,
                         SR: tl.constexpr, HW: tl.constexpr):
    """``round_and_encode`` onto E4M3 / E5M2 (NaN: 0x7F, torch's code), the MXFP8 elements' codes. With HW (a GPU
    converting fp32 to fp8 in one instruction: sm_89 on) RNE is the hardware's saturating conversion
    (``cvt.rn.satfinite``, two elements per instruction: RNE, |x| above MAX to MAX, the sign kept, -0 too): the
    same codes in fewer instructions (tests/ptx_report.py counts them). The interpreter (whose casts round wrongly)
    and SR take the integer path."""
    if HW and not SR:
        fp8: tl.constexpr = tl.float8e4nv if EBITS == 4 else tl.float8e5
        code = x.to(fp8, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True).to(tl.int32)
        return tl.where(x != x, 0x7F, code)
    return round_and_encode(x, rand, EBITS, MBITS, 1 - BIAS, MAX, SR, 0x7F)


@triton.jit
def e2m1_pair(lo, hi, rand_lo, rand_hi, bad, SR: tl.constexpr, HW: tl.constexpr):
    """The int32 byte of two E2M1 codes (``lo``'s in the low nibble) of values already scaled by their block's
    e_b, zero where ``bad`` (a non-finite block, whose e_b and so every scaled value is NaN: NaN's code is +0; a
    finite block's scaled values are never NaN): ``round_and_encode``'s, or with HW (a GPU converting fp32 to E2M1
    in one instruction: sm_100 on) and RNE, the hardware's saturating conversion (``cvt.rn.satfinite.e2m1x2``, one
    per pair: RNE, |x| above 6 to 6 as the reference's clamp, the sign kept)."""
    if HW and not SR:
        byte = tl.inline_asm_elementwise(
            "{ .reg .b8 t; cvt.rn.satfinite.e2m1x2.f32 t, $2, $1; cvt.u32.u8 $0, t; }", "=r,r,r", [lo, hi],
            dtype=tl.int32, is_pure=True, pack=1)
    else:
        hi_code = round_and_encode(hi, rand_hi, 2, 1, 0, 6.0, SR, -1)
        byte = round_and_encode(lo, rand_lo, 2, 1, 0, 6.0, SR, -1) | (hi_code << 4)
    return tl.where(bad, 0, byte)


@triton.jit
def encode_float8(v, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr):
    """uint8 code of fp32 values already on an E4M3/E5M2 grid; NaN gives 0x7F or 0xFF (torch's codes)."""
    bits = v.to(tl.int32, bitcast=True)
    a = (bits & 0x7FFFFFFF).to(tl.float32, bitcast=True)
    normal = ((floor_log2(a) + BIAS) << MBITS) | ((bits >> (23 - MBITS)) & ((1 << MBITS) - 1))
    sub = (a * pow2(tl.full(a.shape, BIAS - 1 + MBITS, tl.int32))).to(tl.int32)
    mag = tl.where(a >= pow2(tl.full(a.shape, 1 - BIAS, tl.int32)), normal, sub)
    mag = tl.where(a != a, 0x7F, mag)
    return (mag | ((bits >> 24) & 0x80)).to(tl.uint8)


@triton.jit
def decode_float8(c, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, HAS_INF: tl.constexpr):
    """fp32 value of uint8 E4M3 (no Inf, NaN = S.1111.111) or E5M2 (IEEE-like) codes."""
    c = c.to(tl.int32)
    exp = (c >> MBITS) & ((1 << EBITS) - 1)
    mant = c & ((1 << MBITS) - 1)
    normal = ((exp - BIAS + 127) << 23) | (mant << (23 - MBITS))
    sub = (mant.to(tl.float32) * pow2(tl.full(c.shape, 1 - BIAS - MBITS, tl.int32))).to(tl.int32, bitcast=True)
    mag = tl.where(exp == 0, sub, normal)
    if HAS_INF:
        top = exp == (1 << EBITS) - 1
        mag = tl.where(top & (mant == 0), 0x7F800000, tl.where(top, 0x7FC00000, mag))
    else:
        mag = tl.where((c & 0x7F) == 0x7F, 0x7FC00000, mag)
    return (mag | ((c & 0x80) << 24)).to(tl.float32, bitcast=True)


@triton.jit
def decode_fp8(c, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, HAS_INF: tl.constexpr,
               HW: tl.constexpr):
    """``decode_float8`` of uint8 codes, or with HW (a GPU converting fp8 in hardware: sm_89 on) the hardware's
    conversion through fp16, exact for both formats (a NaN stays NaN, with the hardware's payload)."""
    if HW:
        fp8: tl.constexpr = tl.float8e5 if HAS_INF else tl.float8e4nv
        return c.to(fp8, bitcast=True).to(tl.float32)
    return decode_float8(c, EBITS, MBITS, BIAS, HAS_INF)


@triton.jit
def decode_e2m1(c):
    """fp32 value of 4-bit E2M1 codes held in an int tensor, from bits: magnitude m >= 2 is 2**(m//2 - 1) ·
    (1 + (m % 2) / 2), whose fp32 bits are (m + 252) << 22; m = 1 is 0.5, m = 0 zero; bit 3 the sign."""
    c = c.to(tl.int32)
    m = c & 7
    mag = tl.where(m >= 2, (m + 252) << 22, tl.where(m == 1, 0x3F000000, 0))
    return (mag | ((c & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def decode_e8m0(c):
    """fp32 2**(c - 127) of uint8 E8M0 codes; 255 is NaN."""
    c = c.to(tl.int32)
    v = tl.where(c == 0, 5.877471754111438e-39, pow2(tl.minimum(tl.maximum(c, 1), 254) - 127))
    return tl.where(c == 255, float("nan"), v)


@triton.jit
def to_bf16_bits(x):
    """Round fp32 to bfloat16 (RNE, NaN kept quiet) and return the 16 bits as int16."""
    bits = x.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return tl.where(x != x, 0x7FC0, rounded & 0xFFFF).to(tl.int16)


@triton.jit
def _mix32(x):
    """random_bits.mix32 (lowbias32) on uint32: the products wrap modulo 2**32 as the reference's do."""
    x = x ^ (x >> 16)
    x = x * 0x21F0AAAD
    x = x ^ (x >> 15)
    x = x * 0x735A2D97
    return x ^ (x >> 15)


@triton.jit
def step_stream_keys(seed_key, step_ptr):
    """random_bits.stream_keys of the stream ``sr_stream(seed, step)`` with ``seed_key`` = mix32(seed) (uint32)
    and the int64 step read at ``step_ptr``: the stream's low word is the step's, its high word the seed."""
    k1 = _mix32(tl.load(step_ptr).to(tl.uint32) ^ seed_key)
    return k1, _mix32(k1 ^ tl.full((), 0x9E3779B9, tl.uint32))


@triton.jit
def group_stream_keys(seed_u32, g, step_ptr):
    """``step_stream_keys`` of group ``g``'s stream (int32, any shape) of a grouped GEMM operand with ``seed``
    (uint32): the key of random_bits.group_seed(seed, g) is mix32(seed) ^ mix32(g + GOLDEN)."""
    golden = tl.full((), 0x9E3779B9, tl.uint32)
    return step_stream_keys(_mix32(seed_u32) ^ _mix32(g.to(tl.uint32) + golden), step_ptr)


@triton.jit
def sr_hash_bits(idx, k1, k2):
    """random_bits.sr_bits computed in place: the 24 random bits of the elements at int64 row-major
    indices ``idx`` of the stream with keys ``k1``, ``k2`` (uint32)."""
    lo = (idx & 0xFFFFFFFF).to(tl.uint32)
    hi = (idx >> 32).to(tl.uint32)
    h = _mix32(_mix32(lo ^ k1) ^ k2 ^ hi)
    return (h >> 8).to(tl.int32)
