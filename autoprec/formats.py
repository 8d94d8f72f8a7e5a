"""Number formats: element types (E2M1, E4M3, E5M2, E8M0) and the block formats built on them.

Everything here is a frozen description; the arithmetic lives in ``autoprec.kernels``.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ElementType:
    """A small IEEE-like float: ``ebits`` exponent bits, ``mbits`` mantissa bits, exponent ``bias``.

    ``max`` is the largest finite magnitude; casts saturate to it. ``emin`` is the exponent of the
    smallest normal number, so the subnormal quantum is ``2**(emin - mbits)``.
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    max: float
    torch_dtype: torch.dtype | None

    @property
    def emin(self) -> int:
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite value (8 for E4M3, 15 for E5M2, 2 for E2M1)."""
        return math.floor(math.log2(self.max))

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits


E2M1 = ElementType("e2m1", ebits=2, mbits=1, bias=1, max=6.0, torch_dtype=None)
E4M3 = ElementType("e4m3", ebits=4, mbits=3, bias=7, max=448.0, torch_dtype=torch.float8_e4m3fn)
E5M2 = ElementType("e5m2", ebits=5, mbits=2, bias=15, max=57344.0, torch_dtype=torch.float8_e5m2)


@dataclass(frozen=True)
class ScaleType:
    """A block-scale type: E4M3 (NVFP4), the power-of-two E8M0 (MX; code 255 = NaN) or fp32 (FP8 block scaling)."""

    name: str
    bits: int


E4M3_SCALE = ScaleType("e4m3", 8)
E8M0 = ScaleType("e8m0", 8)
FP32_SCALE = ScaleType("fp32", 32)


@dataclass(frozen=True)
class Format:
    """Base of the number formats a GEMM operand can take."""

    name: str
    block_size: int
    elem: ElementType | None
    scale: ScaleType | None
    elem_bits: int
    tensor_scale_bits: int
    tile: int = 0  # side of the square tiles a weight may take (one scale per tile); 0: 1-D blocks only

    @property
    def bits_per_value(self) -> float:
        """Storage bits per value, block scales included (the per-tensor scale is negligible)."""
        scale_bits = self.scale.bits / self.block_size if self.scale else 0.0
        return self.elem_bits + scale_bits

    @property
    def max_value(self) -> float:
        """Largest finite element magnitude before scaling."""
        return self.elem.max if self.elem else float(torch.finfo(torch.bfloat16).max)

    @property
    def quantized(self) -> bool:
        return self.scale is not None


@dataclass(frozen=True)
class NVFP4Format(Format):
    """NVFP4: E2M1 values, blocks of 16 with an E4M3 scale, plus an FP32 tensor scale."""

    name: str = "nvfp4"
    block_size: int = 16
    elem: ElementType | None = E2M1
    scale: ScaleType | None = E4M3_SCALE
    elem_bits: int = 4
    tensor_scale_bits: int = 32
    tile: int = 16


@dataclass(frozen=True)
class MXFP8E4M3Format(Format):
    """MXFP8 with E4M3 elements: blocks of 32 sharing a power-of-two E8M0 scale."""

    name: str = "mxfp8"
    block_size: int = 32
    elem: ElementType | None = E4M3
    scale: ScaleType | None = E8M0
    elem_bits: int = 8
    tensor_scale_bits: int = 0


@dataclass(frozen=True)
class MXFP8E5M2Format(Format):
    """MXFP8 with E5M2 elements (wider range; the ``hybrid`` choice for gradients)."""

    name: str = "mxfp8_e5m2"
    block_size: int = 32
    elem: ElementType | None = E5M2
    scale: ScaleType | None = E8M0
    elem_bits: int = 8
    tensor_scale_bits: int = 0


@dataclass(frozen=True)
class FP8BlockFormat(Format):
    """FP8 block scaling (DeepSeek-V3, Transformer Engine's ``Float8BlockScaling``): E4M3 values, one fp32
    power-of-two scale per 128 consecutive values of activations and gradients and per 128x128 tile of weights.
    Hopper's fast format: its FP8 tensor cores multiply it through cuBLAS, at twice BF16's peak."""

    name: str = "fp8_block"
    block_size: int = 128
    elem: ElementType | None = E4M3
    scale: ScaleType | None = FP32_SCALE
    elem_bits: int = 8
    tensor_scale_bits: int = 0
    tile: int = 128


@dataclass(frozen=True)
class BF16Format(Format):
    """Plain bfloat16: no blocks, no scales."""

    name: str = "bf16"
    block_size: int = 1
    elem: ElementType | None = None
    scale: ScaleType | None = None
    elem_bits: int = 16
    tensor_scale_bits: int = 0


NVFP4 = NVFP4Format()
MXFP8 = MXFP8E4M3Format()
MXFP8_E5M2 = MXFP8E5M2Format()
FP8_BLOCK = FP8BlockFormat()
BF16 = BF16Format()

FORMATS: dict[str, Format] = {f.name: f for f in (NVFP4, MXFP8, MXFP8_E5M2, FP8_BLOCK, BF16)}


def closest(name: str, valid: list[str]) -> str:
    """A ', '-joined hint of the valid names closest to ``name`` (all of them if none is close)."""
    near = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
    return ", ".join(near or valid)


def get_format(name: str | Format) -> Format:
    """Look a format up by name; a wrong name raises ValueError listing the closest valid ones."""
    if isinstance(name, Format):
        return name
    if not isinstance(name, str):
        raise TypeError(f"format must be a str or Format, got {type(name).__name__}")
    key = name.lower()
    if key not in FORMATS:
        raise ValueError(f"unknown format {name!r}; valid formats: {closest(key, list(FORMATS))}")
    return FORMATS[key]
