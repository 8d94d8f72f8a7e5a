"""Reference element rounding: fp32 onto the E2M1 / E4M3 / E5M2 grids, and E8M0 exponents.

Every step is exact fp32 arithmetic or integer work on the fp32 bits, so the Triton kernels can run
the very same sequence and agree bit for bit (also under TRITON_INTERPRET=1, whose float casts round
wrongly). A value ``v`` with ``|v| <= max`` is written as ``s * Q`` where ``Q = 2**(max(E, emin) - mbits)``
is the grid spacing of its binade (``E = floor(log2|v|)``); ``s = |v| / Q`` is exact and rounding ``s``
to an integer is rounding ``v`` to the grid, with the carry into the next binade falling out for free.
"""
from __future__ import annotations

import torch

from autoprec.formats import ElementType

from ..core.random_bits import SR_BITS

SIGN_MASK = -0x80000000  # 0x80000000 as an int32
ABS_MASK = 0x7FFFFFFF
MAGIC_RNE = 8388608.0  # 2**23: adding and subtracting it rounds an fp32 in [0, 2**23) to an integer, RNE
FLT_MAX = torch.finfo(torch.float32).max
CANONICAL_NAN = float("nan")  # 0x7FC00000: NaN payloads and signs are not kept


def pow2(e: torch.Tensor) -> torch.Tensor:
    """Exact fp32 ``2**e`` for integer tensors ``e`` in [-126, 127], built from the exponent bits."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def floor_log2(a: torch.Tensor) -> torch.Tensor:
    """``floor(log2 a)`` for positive finite fp32 ``a`` read off the exponent field (subnormals give -127)."""
    return ((a.view(torch.int32) >> 23) & 0xFF) - 127


def round_to_element(
    x: torch.Tensor, elem: ElementType, rand: torch.Tensor | None = None
) -> torch.Tensor:
    """Round fp32 ``x`` to the nearest ``elem`` value (ties to even), saturating at ``±elem.max``.

    With ``rand`` (int32 of x's shape, low 24 bits used) it rounds stochastically instead: up with
    probability equal to the position between the two neighbouring grid points. NaN becomes the
    canonical positive quiet NaN, ±Inf saturates, the sign (also of -0) is kept. Returns fp32 values
    that lie exactly on the grid.
    """
    assert x.dtype == torch.float32
    a = torch.clamp((x.view(torch.int32) & ABS_MASK).view(torch.float32), max=elem.max)
    e = torch.clamp(floor_log2(a), min=elem.emin) - elem.mbits
    s = a * pow2(-e)
    if rand is None:
        r = (s + MAGIC_RNE) - MAGIC_RNE
    else:
        lo = torch.floor(s)
        u = (rand & ((1 << SR_BITS) - 1)).to(torch.float32) * (2.0**-SR_BITS)
        r = lo + (u < (s - lo)).to(torch.float32)
    mag = r * pow2(e)
    out = (mag.view(torch.int32) | (x.view(torch.int32) & SIGN_MASK)).view(torch.float32)
    return torch.where(torch.isnan(x), CANONICAL_NAN, out)


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """4-bit codes (uint8, sign in bit 3) of fp32 values already on the E2M1 grid; NaN encodes as 0."""
    bits = v.view(torch.int32)
    a = (bits & ABS_MASK).view(torch.float32)
    exp_field = (bits >> 23) & 0xFF
    normal = ((exp_field - 126) << 1) | ((bits >> 22) & 1)  # |v| >= 1: exponent 0..2 -> fields 1..3
    mag = torch.where(a >= 1.0, normal, (a * 2.0).to(torch.int32))
    code = mag | ((bits >> 28) & 0x8)
    return torch.where(torch.isnan(v), 0, code).to(torch.uint8)


E2M1_VALUES = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of 4-bit E2M1 codes (uint8 holding one code each)."""
    return E2M1_VALUES.to(codes.device)[codes.long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes two per byte along the last dim, the even index in the low nibble."""
    assert codes.shape[-1] % 2 == 0
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def e8m0_rceil(amax: torch.Tensor, elem: ElementType) -> torch.Tensor:
    """RCEIL exponent ``clamp(ceil(log2(amax / elem.max)), -127, 127)`` from the fp32 bits (int32)."""
    q = amax / torch.full_like(amax, elem.max)  # a tensor divisor: CUDA turns `/ scalar` into `* (1/scalar)`
    normal = floor_log2(q) + ((q.view(torch.int32) & 0x7FFFFF) != 0).to(torch.int32)
    # below 2**-126 the ratio is an fp32 subnormal (or zero): its ceil(log2) is -126 or clamps to -127
    tiny = torch.where(q > 2.0**-127, -126, -127)
    return torch.clamp(torch.where(q >= 2.0**-126, normal, tiny), -127, 127)


def e8m0_floor(amax: torch.Tensor, elem: ElementType) -> torch.Tensor:
    """OCP v1.0 FLOOR exponent ``floor(log2 amax) - emax_elem``, clamped to [-127, 127] (int32)."""
    e = torch.where(amax > 0, floor_log2(amax) - elem.emax, -127)
    return torch.clamp(e, -127, 127)


def e8m0_decode(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values ``2**(code - 127)`` of E8M0 codes (uint8); code 255 is NaN."""
    c = codes.to(torch.int32)
    v = torch.where(c == 0, 2.0**-127, pow2(torch.clamp(c, 1, 254) - 127))
    return torch.where(c == 255, float("nan"), v)
