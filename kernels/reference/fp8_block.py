"""Reference FP8 block-scaling quantizer: E4M3 values, one fp32 power-of-two scale per 1x128 block (activations,
gradients) or 128x128 tile (weights), as Transformer Engine's ``Float8BlockScaling`` computes them by default.

Per block: ``amax`` over the finite values; the encode factor ``fp32(448 / amax)`` (FLT_MAX where that overflows)
with its mantissa cleared, a power of two ``2**e``; elements ``RNE(x · 2**e)`` on the E4M3 grid, saturating at
±448; the stored scale is the decode factor ``2**-e`` (exact, possibly an fp32 subnormal). A block of zeros
has scale 1. A block holding NaN/Inf gets a NaN scale, so it dequantizes to NaN, as in the other formats.
Why powers of two: scaling is exact (no rounding before the E4M3 cast), so the 1x128 quantization of a tile's
rows and the tile's own agree wherever their factors do, and the format is TE's default; fp32 scales cost 32
bits per 128 values. See docs/numerics.md.
"""
from __future__ import annotations

import torch

from autoprec.formats import E4M3, FP8_BLOCK

from ..core.quantized import (
    QuantizedTensor,
    as_blocks,
    block_amax,
    blocked_view,
    from_blocks,
    normalize_axis,
    reference_core,
)
from .rounding import FLT_MAX, floor_log2, pow2, round_to_element

BLOCK = FP8_BLOCK.block_size


def fp8_block_exponent(amax: torch.Tensor) -> torch.Tensor:
    """``e`` of the encode factor ``2**e``: the exponent of fp32(448 / amax) (FLT_MAX's where it overflows);
    0 for an all-zero block (int32)."""
    q = torch.clamp(torch.full_like(amax, E4M3.max) / amax, max=FLT_MAX)  # a tensor divisor: correctly rounded
    return torch.where(amax > 0, floor_log2(q), 0)


def quantize_fp8_block_ref(
    x: torch.Tensor, axis: int = -1, *, tile2d: bool = False, rand: torch.Tensor | None = None
) -> QuantizedTensor:
    """Quantize ``x`` to FP8-block along ``axis``: 1x128 blocks, or 128x128 tiles (``tile2d``, 2D ``x``);
    ``rand`` (int32 of x's shape) rounds the elements stochastically."""
    tile_rows = BLOCK if tile2d else 1
    xm = blocked_view(x, FP8_BLOCK, axis, tile_rows)
    axis = normalize_axis(axis, x.ndim)
    r = None if rand is None else rand.movedim(axis, -1).contiguous()
    elems, scales = reference_core(fp8_block_core)(xm, r, tile_rows)
    return QuantizedTensor(FP8_BLOCK, elems.to(torch.float8_e4m3fn), scales, None, axis, x.shape, tile_rows)


def fp8_block_core(xm: torch.Tensor, r: torch.Tensor | None, tile_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tensor part of the quantizer on the blocked fp32 view: fp32 elements on the E4M3 grid, fp32 decode scales."""
    blocks = as_blocks(xm, BLOCK, tile_rows)
    amax, bad = block_amax(blocks)
    e = fp8_block_exponent(amax)
    rb = None if r is None else as_blocks(r, BLOCK, tile_rows)
    elems = round_to_element(blocks * pow2(e)[..., None], E4M3, rb)
    scales = torch.where(bad, float("nan"), decode_factor(e))
    return from_blocks(elems, tile_rows), scales


def decode_factor(e: torch.Tensor) -> torch.Tensor:
    """fp32 ``2**-e`` for ``e`` in [-127, 127] (``2**-127`` is an fp32 subnormal, exact)."""
    return torch.where(e >= 127, pow2(-e.clamp(max=126)) * 0.5, pow2(-e.clamp(max=126)))


def dequantize_fp8_block_ref(q: QuantizedTensor) -> torch.Tensor:
    """fp32 values ``element · scale`` in the logical layout of the original tensor."""
    return reference_core(fp8_block_values)(q.codes.to(torch.float32), q.scales, q.tile_rows).movedim(-1, q.axis)


def fp8_block_values(codes: torch.Tensor, scales: torch.Tensor, tile_rows: int) -> torch.Tensor:
    return from_blocks(as_blocks(codes, BLOCK, tile_rows) * scales[..., None], tile_rows)
