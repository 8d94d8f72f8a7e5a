"""Format-generic entry points over the reference quantizers: quantize, dequantize, fake-quantize."""
from __future__ import annotations

import torch

from autoprec.formats import BF16, FP8_BLOCK, NVFP4, Format, get_format
from autoprec.quant_spec import Rounding, values

from ..core.quantized import QuantizedTensor, check_blocks
from ..core.random_bits import sr_bits
from .fp8_block import dequantize_fp8_block_ref, quantize_fp8_block_ref
from .mxfp8 import check_mx_format, dequantize_mxfp8_ref, quantize_mxfp8_ref
from .nvfp4 import dequantize_nvfp4_ref, quantize_nvfp4_ref

ROUNDINGS = values(Rounding)


def check_rounding(rounding: str) -> None:
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; valid: {', '.join(ROUNDINGS)}")


def check_quantize_args(
    x: torch.Tensor, fmt: str | Format, axis: int, rounding: str, tile2d: bool, scale_mode: str
) -> Format:
    """Validate a quantize call (format, rounding, options, block shape); returns the Format."""
    fmt = get_format(fmt)
    check_rounding(rounding)
    if not fmt.quantized:
        raise ValueError(f"format {fmt.name!r} has no quantized storage; use fake_quantize_ref")
    if tile2d and not fmt.tile:
        raise ValueError(f"tile2d (square weight tiles) is an option of NVFP4 and fp8_block, not of {fmt.name!r}")
    if fmt not in (NVFP4, FP8_BLOCK):
        check_mx_format(fmt, scale_mode)
    check_blocks(x, fmt, axis, fmt.tile if tile2d else 1)
    return fmt


def quantize_ref(
    x: torch.Tensor,
    fmt: str | Format,
    axis: int = -1,
    *,
    rounding: str = "rne",
    seed: int = 0,
    rand: torch.Tensor | None = None,
    tile2d: bool = False,
    scale_mode: str = "rceil",
    amax: torch.Tensor | None = None,
) -> QuantizedTensor:
    """Quantize ``x`` into a block format, blocked along ``axis``.

    ``rounding="sr"`` rounds elements stochastically with random bits from ``seed`` (or the given
    ``rand``, int32 of x's shape). ``tile2d`` (NVFP4, FP8-block) uses square tiles (16x16, 128x128);
    ``scale_mode`` (MXFP8 only) is ``rceil`` or ``floor``; ``amax`` (NVFP4 only) a given tensor amax
    (``quantize_nvfp4_ref``).
    """
    fmt = check_quantize_args(x, fmt, axis, rounding, tile2d, scale_mode)
    if rounding == "sr" and rand is None:
        rand = sr_bits(x.shape, seed, x.device)
    elif rounding == "rne":
        rand = None
    if fmt is NVFP4:
        return quantize_nvfp4_ref(x, axis, tile2d=tile2d, rand=rand, amax=amax)
    if fmt is FP8_BLOCK:
        return quantize_fp8_block_ref(x, axis, tile2d=tile2d, rand=rand)
    return quantize_mxfp8_ref(x, axis, fmt=fmt, scale_mode=scale_mode, rand=rand)


def dequantize_ref(q: QuantizedTensor) -> torch.Tensor:
    """fp32 values of a quantized tensor, in its original layout."""
    if q.fmt is NVFP4:
        return dequantize_nvfp4_ref(q)
    return dequantize_fp8_block_ref(q) if q.fmt is FP8_BLOCK else dequantize_mxfp8_ref(q)


def fake_quantize_ref(x: torch.Tensor, fmt: str | Format, axis: int = -1, **kwargs) -> torch.Tensor:
    """fp32 ``dequantize(quantize(x))``; for BF16 the round trip through a bfloat16 cast."""
    fmt = get_format(fmt)
    if fmt is BF16:
        return x.to(torch.bfloat16).to(torch.float32)
    return dequantize_ref(quantize_ref(x, fmt, axis, **kwargs))
