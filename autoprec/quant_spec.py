"""How one GEMM operand is quantized, in one frozen value: what a candidate or a decision implies for each operand,
what calibration measures, what the rewrite writes into the graph's quantize ops and what the kernels take.
See docs/design.md."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from autoprec.formats import closest, get_format


class Rounding(str, Enum):
    """Rounding to the element grid: to nearest even, or stochastic (gradients only)."""

    RNE = "rne"
    SR = "sr"


class ScaleRule(str, Enum):
    """MXFP8's E8M0 block exponent: ``rceil`` (NVIDIA's hardware and cuBLAS) or ``floor`` (OCP MX v1.0)."""

    RCEIL = "rceil"
    FLOOR = "floor"


def values(enum: type[Enum]) -> tuple[str, ...]:
    """The string values of a string enum, for validation messages and option checks."""
    return tuple(e.value for e in enum)


def parse(enum: type[Enum], value: str | Enum, what: str) -> Enum:
    """``value`` as a member of ``enum``; a wrong one raises ValueError naming ``what`` and the closest values."""
    try:
        return enum(value)
    except ValueError:
        raise ValueError(f"unknown {what} {value!r}; valid: {closest(str(value), list(values(enum)))}") from None


@dataclass(frozen=True)
class QuantSpec:
    """One operand's quantization: its format, the axis its blocks run along (the GEMM's reduction dim), its
    rounding, whether it takes the random Hadamard transform, whether a weight takes 16x16 NVFP4 tiles, and the
    E8M0 rule of MXFP8's block scales."""

    fmt: str
    axis: int
    rounding: Rounding = Rounding.RNE
    rht: bool = False
    tile2d: bool = False
    scale_rule: ScaleRule = ScaleRule.RCEIL

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", get_format(self.fmt).name)
        object.__setattr__(self, "rounding", parse(Rounding, self.rounding, "rounding"))
        object.__setattr__(self, "scale_rule", parse(ScaleRule, self.scale_rule, "MX scale rule"))

    def kwargs(self) -> dict:
        """The keyword arguments ``autoprec.kernels.quantize`` takes for this spec (besides format and axis)."""
        return {"rounding": self.rounding.value, "tile2d": self.tile2d, "scale_mode": self.scale_rule.value,
                "rht": self.rht}
