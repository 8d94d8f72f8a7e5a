"""The configurations a GEMM can take (format x rounding x RHT x weight tiles) and which of them each
phase allows for each role."""
from __future__ import annotations

from dataclasses import dataclass

from autoprec.formats import get_format
from autoprec.quant_spec import QuantSpec
from autoprec.roles import MatmulRole


@dataclass(frozen=True)
class Candidate:
    """One way to run a GEMM. ``rounding`` applies to the gradient operand, ``tile2d`` to the weight."""

    fmt: str
    rounding: str = "rne"
    rht: bool = False
    tile2d: bool = False

    @property
    def label(self) -> str:
        parts = [self.fmt]
        if self.fmt != "bf16":
            parts.append(self.rounding)
        if self.rht:
            parts.append("rht")
        if self.tile2d:
            tile = get_format(self.fmt).tile
            parts.append(f"{tile}x{tile}")
        return "/".join(parts)


BF16 = Candidate("bf16")
MXFP8 = Candidate("mxfp8")
NVFP4 = Candidate("nvfp4")
NVFP4_2D = Candidate("nvfp4", tile2d=True)
NVFP4_SR = Candidate("nvfp4", "sr")
NVFP4_SR_2D = Candidate("nvfp4", "sr", tile2d=True)
NVFP4_SR_RHT = Candidate("nvfp4", "sr", rht=True)
FP8_BLOCK = Candidate("fp8_block")
FP8_BLOCK_2D = Candidate("fp8_block", tile2d=True)

# what the pretrain policy lets the solver pick (and calibration measures): forward by error; backward
# only unbiased NVFP4 (stochastic rounding on gradients, RHT on wgrad operands), as in NVIDIA's recipe ...
# FP8-block rounds to nearest in every role, as DeepSeek-V3 and Transformer Engine's Float8BlockScaling do: its
# 128-wide blocks of E4M3 keep gradients' bias far below NVFP4's. The hardware's menu (cost.Hardware.formats)
# decides which of these formats a plan may take at all.
ELIGIBLE = {
    MatmulRole.FPROP: (NVFP4, NVFP4_2D, MXFP8, FP8_BLOCK, FP8_BLOCK_2D, BF16),
    MatmulRole.DGRAD: (NVFP4_SR, NVFP4_SR_2D, MXFP8, FP8_BLOCK, FP8_BLOCK_2D, BF16),
    MatmulRole.WGRAD: (NVFP4_SR_RHT, MXFP8, FP8_BLOCK, BF16),
}
# ... and the biased backward configurations it never picks, measured too with options measure="all" (for
# studies of the damage model: what round-to-nearest and SR without the RHT would cost)
BIASED = {
    MatmulRole.FPROP: (),
    MatmulRole.DGRAD: (NVFP4,),
    MatmulRole.WGRAD: (NVFP4, NVFP4_SR),
}


def operand_spec(choice, which: int, ndim: int, grad_operand: int | None, weight_operand: int | None,
                 scale_rule: str = "rceil") -> QuantSpec:
    """How operand ``which`` (0 = a, 1 = b) of a GEMM run as ``choice`` (a Candidate or a Decision) is quantized:
    blocked along the reduction dim, the choice's rounding on the gradient operand only, tiles on a 2D NVFP4 weight
    only, the RHT on both operands where the choice has it."""
    return QuantSpec(choice.fmt, ndim - 1 if which == 0 else ndim - 2,
                     choice.rounding if grad_operand == which else "rne", choice.rht,
                     choice.tile2d and get_format(choice.fmt).tile > 0 and weight_operand == which and ndim == 2,
                     scale_rule)


def measured(role: MatmulRole, has_weight: bool, measure: str = "eligible",
             menu: tuple[str, ...] | None = None) -> tuple[Candidate, ...]:
    """Candidates calibration measures for a GEMM (weight tiles only where there is a weight): the eligible ones
    of the hardware's ``menu`` of formats (None: every format), and with ``measure="all"`` the biased ones too."""
    if measure == "amax":  # a preset's static activation scales: only the operands' amaxes are recorded
        return ()
    extra = BIASED[role] if measure == "all" else ()
    return tuple(c for c in extra + ELIGIBLE[role]
                 if (has_weight or not c.tile2d) and (menu is None or c.fmt in menu))


def eligible(role: MatmulRole, has_weight: bool, menu: tuple[str, ...] | None = None) -> tuple[Candidate, ...]:
    return tuple(c for c in ELIGIBLE[role] if (has_weight or not c.tile2d) and (menu is None or c.fmt in menu))


def grouped_config(choice, grad_operand: int | None, weight_operand: int | None) -> dict:
    """``grouped.grouped_mm``'s per-operand options for a grouped GEMM run as ``choice``: each group is a
    2D product, so the dense rules apply group by group (16x16 tiles on each expert's weight)."""
    a, b = (operand_spec(choice, w, 2, grad_operand, weight_operand) for w in (0, 1))
    return {"rounding_a": a.rounding.value, "rounding_b": b.rounding.value, "tile2d_b": b.tile2d, "rht": choice.rht}
