"""Hardware cost model: projected GEMM time from FLOPs per format plus memory traffic.

A GEMM takes the roofline time ``max(FLOPs / peak(format), bytes / bandwidth)``, its bytes being the
operands in their format and a BF16 output. Quantizing an operand is assumed fused into the kernel that
produces it (as Transformer Engine fuses casts into norms and activations): its extra traffic is writing
the codes and scales. Small GEMMs are memory-bound, so low precision helps them less than FLOP ratios say.
"""
from __future__ import annotations

from dataclasses import dataclass

from autoprec.formats import closest, get_format


@dataclass(frozen=True)
class Hardware:
    """Dense tensor throughput per format (PFLOP/s) and memory bandwidth (TB/s)."""

    name: str
    nvfp4_pflops: float
    mxfp8_pflops: float
    bf16_pflops: float
    hbm_tbs: float
    note: str = ""

    def pflops(self, fmt: str) -> float:
        return {"nvfp4": self.nvfp4_pflops, "mxfp8": self.mxfp8_pflops, "mxfp8_e5m2": self.mxfp8_pflops,
                "bf16": self.bf16_pflops}[get_format(fmt).name]


HARDWARE = {
    "gb300": Hardware("gb300", 15.0, 5.0, 2.5, 8.0, "Blackwell Ultra dense figures"),
    "b200": Hardware("b200", 9.0, 4.5, 2.25, 8.0, "Blackwell dense figures"),
    "h100": Hardware("h100", 0.99, 1.98, 0.99, 3.35, "no FP4 tensor cores: NVFP4 runs at BF16 speed"),
}


def get_hardware(name: str) -> Hardware:
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; valid: {closest(name, list(HARDWARE))}")
    return HARDWARE[name]


def gemm_seconds(flops: float, operand_elems: float, out_elems: float, fmt: str, hw: Hardware) -> float:
    """Projected time of one GEMM in ``fmt``: roofline of math and operand + output bytes, plus the
    quantization's write of codes and scales for block formats."""
    f = get_format(fmt)
    operand_bytes = operand_elems * f.bits_per_value / 8
    bandwidth = hw.hbm_tbs * 1e12
    roofline = max(flops / (hw.pflops(fmt) * 1e15), (operand_bytes + out_elems * 2.0) / bandwidth)
    return roofline + (operand_bytes / bandwidth if f.quantized else 0.0)
