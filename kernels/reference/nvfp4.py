"""Reference NVFP4 quantizer: E2M1 codes, E4M3 block scales (1x16 or 16x16), FP32 tensor scale.

The scale chain follows DESIGN.md §3 step by step in fp32. Non-finite input: the tensor amax is taken
over the finite values (one NaN must not flush every other block to zero), and every block holding
NaN/Inf gets a NaN scale, so it dequantizes to NaN. An empty tensor quantizes to empty codes and scales.
"""
from __future__ import annotations

import torch

from autoprec.formats import E2M1, E4M3, NVFP4

from ..core.quantized import (
    QuantizedTensor,
    as_blocks,
    block_amax,
    blocked_view,
    from_blocks,
    normalize_axis,
    reference_core,
)
from .rounding import (
    FLT_MAX,
    e2m1_decode,
    e2m1_encode,
    pack_nibbles,
    round_to_element,
    unpack_nibbles,
)

BLOCK = NVFP4.block_size
# fp32 constants as Python floats holding their fp32 values, so no constant tensor is copied to the GPU (such a
# copy waits for it). The quotient divides a filled tensor: torch computes ``float / tensor`` as
# ``reciprocal(tensor) * float``, which is not the correctly rounded fp32 quotient the scale chain specifies.
FP4_TIMES_FP8_MAX = 448.0 * 6.0
ONE_SIXTH = torch.tensor(1.0 / 6.0, dtype=torch.float32).item()


def nvfp4_encode_scale(amax_t: torch.Tensor) -> torch.Tensor:
    """S_enc = min(448·6 / amax_t, FLT_MAX), and 1 where amax_t is 0 or non-finite or S_enc is 0."""
    s_enc = torch.clamp(torch.full_like(amax_t, FP4_TIMES_FP8_MAX) / amax_t, max=FLT_MAX)
    ok = (amax_t > 0) & torch.isfinite(amax_t) & (s_enc > 0)
    return torch.where(ok, s_enc, torch.ones_like(s_enc))


def scale_to_block(s_enc: torch.Tensor) -> torch.Tensor:
    """S_enc · fp32(1/6): the factor from a block amax to its E4M3 scale before rounding."""
    return s_enc * ONE_SIXTH


def quantize_nvfp4_ref(
    x: torch.Tensor,
    axis: int = -1,
    *,
    tile2d: bool = False,
    rand: torch.Tensor | None = None,
    amax: torch.Tensor | None = None,
) -> QuantizedTensor:
    """Quantize ``x`` to NVFP4 in blocks of 16 along ``axis`` (16x16 tiles with ``tile2d``).

    ``rand`` (int32, x's shape) switches element rounding to stochastic; scales always round to
    nearest even. ``amax`` (the fp32 bits of a tensor amax in one int32) replaces x's own finite amax in the
    tensor scale: a static scale fixed beforehand, under which blocks above it saturate their E4M3 scale.
    """
    tile_rows = BLOCK if tile2d else 1
    xm = blocked_view(x, NVFP4, axis, tile_rows)
    axis = normalize_axis(axis, x.ndim)
    r = None if rand is None else rand.movedim(axis, -1).contiguous()
    if xm.numel() == 0:
        codes, s_b, s_dec = _empty_parts(xm, tile_rows)
    else:
        given = None if amax is None else amax.reshape(()).view(torch.float32)
        codes, s_b, s_dec = reference_core(nvfp4_core)(xm, r, tile_rows, given)
    return QuantizedTensor(NVFP4, codes, s_b.to(torch.float8_e4m3fn), s_dec, axis, x.shape, tile_rows)


def _empty_parts(xm: torch.Tensor, tile_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes, block scales and S_dec (1) of an empty blocked view, shaped as the core would shape them."""
    lead, k = tuple(xm.shape[:-1]), xm.shape[-1]
    scale_shape = (lead[0] // BLOCK, k // BLOCK) if tile_rows > 1 else lead + (k // BLOCK,)
    codes = torch.zeros(lead + (k // 2,), dtype=torch.uint8, device=xm.device)
    return codes, torch.zeros(scale_shape, device=xm.device), torch.ones((), device=xm.device)


def nvfp4_core(
    xm: torch.Tensor, r: torch.Tensor | None, tile_rows: int, amax_t: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tensor part of the quantizer on the blocked fp32 view: packed codes, fp32 block scales, S_dec.
    The tensor amax is ``amax_t`` where given, else the max of the block amaxes, which leave NaN/Inf out."""
    blocks = as_blocks(xm, BLOCK, tile_rows)
    amax_b, bad = block_amax(blocks)
    s_enc = nvfp4_encode_scale(amax_b.amax() if amax_t is None else amax_t)
    s_dec = 1.0 / s_enc
    s_b = round_to_element(amax_b * scale_to_block(s_enc), E4M3)
    s_b = torch.where(bad, float("nan"), s_b)
    e_b = torch.clamp(1.0 / (s_b * s_dec), max=FLT_MAX)
    rt = None if r is None else as_blocks(r, BLOCK, tile_rows)
    v = round_to_element(torch.clamp(blocks * e_b[..., None], -E2M1.max, E2M1.max), E2M1, rt)
    return pack_nibbles(e2m1_encode(from_blocks(v, tile_rows))), s_b, s_dec.reshape(())


def dequantize_nvfp4_ref(q: QuantizedTensor) -> torch.Tensor:
    """fp32 values ``code · fp32(s_b) · S_dec`` in the logical layout of the original tensor."""
    out = reference_core(nvfp4_values)(q.codes, q.scales.to(torch.float32), q.tensor_scale, q.tile_rows)
    return out.movedim(-1, q.axis)


def nvfp4_values(codes: torch.Tensor, scales: torch.Tensor, s_dec: torch.Tensor, tile_rows: int) -> torch.Tensor:
    vals = as_blocks(e2m1_decode(unpack_nibbles(codes)), BLOCK, tile_rows)
    return from_blocks(vals * scales[..., None] * s_dec, tile_rows)


def transpose_tiles_ref(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The stored (codes, scales) of the transpose of a 16x16-tiled NVFP4 matrix stored (R, K) as uint8 codes
    (R, K/2) and scales (R/16, K/16): the same tiles with the same scales and every element with its code, now
    blocked along the other dim. With 16x16 tiles this is exactly the quantization of the transposed matrix."""
    nibbles = torch.stack((codes & 0xF, codes >> 4), -1).flatten(-2).t()
    packed = (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).contiguous()
    return packed, scales.t().clone(memory_format=torch.contiguous_format)  # a copy even where .t() is contiguous
