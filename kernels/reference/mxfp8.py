"""Reference MXFP8 quantizer: E4M3 or E5M2 elements in blocks of 32 with an E8M0 scale.

Scale exponent RCEIL (default, as NVIDIA hardware and cuBLAS) or FLOOR (OCP v1.0). A block holding
NaN/Inf gets scale code 255 (NaN), so it dequantizes to NaN.
"""
from __future__ import annotations

import torch

from autoprec.formats import MXFP8, MXFP8_E5M2, ElementType, Format
from autoprec.quant_spec import ScaleRule, values

from ..core.quantized import QuantizedTensor, block_amax, blocked_view, normalize_axis, reference_core
from .rounding import e8m0_decode, e8m0_floor, e8m0_rceil, pow2, round_to_element

SCALE_MODES = values(ScaleRule)
MX_BLOCK = MXFP8.block_size
E8M0_NAN = 255


def check_mx_format(fmt: Format, scale_mode: str) -> None:
    if fmt not in (MXFP8, MXFP8_E5M2):
        raise ValueError(f"MXFP8 quantize needs format mxfp8 or mxfp8_e5m2, got {fmt.name!r}")
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"unknown MX scale_mode {scale_mode!r}; valid: {', '.join(SCALE_MODES)}")


def quantize_mxfp8_ref(
    x: torch.Tensor,
    axis: int = -1,
    *,
    fmt: Format = MXFP8,
    scale_mode: str = "rceil",
    rand: torch.Tensor | None = None,
) -> QuantizedTensor:
    """Quantize ``x`` to MXFP8 in blocks of 32 along ``axis``; ``rand`` (int32) selects SR."""
    check_mx_format(fmt, scale_mode)
    xm = blocked_view(x, fmt, axis)
    axis = normalize_axis(axis, x.ndim)
    r = None if rand is None else rand.movedim(axis, -1).contiguous()
    elems, scales = reference_core(mxfp8_core)(xm, r, fmt.elem, scale_mode == "floor")
    return QuantizedTensor(fmt, elems.to(fmt.elem.torch_dtype), scales, None, axis, x.shape)


def mxfp8_core(
    xm: torch.Tensor, r: torch.Tensor | None, elem: ElementType, floor: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tensor part of the quantizer on the blocked fp32 view: fp32 elements on the grid, E8M0 codes."""
    blocks = xm.unflatten(-1, (-1, MX_BLOCK))
    amax_b, bad = block_amax(blocks)
    e = (e8m0_floor if floor else e8m0_rceil)(amax_b, elem)
    rb = None if r is None else r.unflatten(-1, (-1, MX_BLOCK))
    elems = round_to_element(blocks * pow2(-e)[..., None], elem, rb)
    return elems.flatten(-2), torch.where(bad, E8M0_NAN, e + 127).to(torch.uint8)


def dequantize_mxfp8_ref(q: QuantizedTensor) -> torch.Tensor:
    """fp32 values ``element · 2**(scale - 127)`` in the logical layout of the original tensor."""
    return reference_core(mxfp8_values)(q.codes.to(torch.float32), q.scales).movedim(-1, q.axis)


def mxfp8_values(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    vals = codes.unflatten(-1, (-1, MX_BLOCK))
    return (vals * e8m0_decode(scales)[..., None]).flatten(-2)
