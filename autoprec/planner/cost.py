"""Hardware cost model: projected GEMM time from FLOPs per format plus memory traffic.

A GEMM takes the roofline time ``max(FLOPs / peak(format), bytes / bandwidth)``, its bytes being the
operands in their format and a BF16 output. Quantizing an operand is assumed fused into the kernel that
produces it (as Transformer Engine fuses casts into norms and activations): its extra traffic is writing
the codes and scales. Small GEMMs are memory-bound, so low precision helps them less than FLOP ratios say.
Where autoprec decodes block formats to bf16 in memory first (Hopper), the GEMM reads bf16 operands and
the decoding adds a read of the codes and a write of the bf16 copy: slower than BF16 at every shape.
Hopper's FP8 tensor cores run FP8-block natively (cuBLAS's blockwise-scaled GEMM) at twice BF16's peak.
Each table also names the hardware's menu: the formats a plan may choose there (overrides may name any).
"""
from __future__ import annotations

from dataclasses import dataclass

from autoprec.formats import closest, get_format


@dataclass(frozen=True)
class Hardware:
    """Dense tensor throughput per format (PFLOP/s) of the GEMMs autoprec runs there, memory bandwidth (TB/s),
    the ``formats`` a plan may choose there (its menu) and the ``native`` ones its tensor cores multiply as they
    are; any other block format is decoded to bf16 in memory for a BF16 GEMM at ``bf16_pflops``. On Blackwell
    NVFP4 and MXFP8 run on the block-scaled tensor cores and FP8-block is left off the menu (Transformer Engine
    emulates it with MXFP8 there, and MXFP8's finer blocks run at the same rate). On Hopper FP8-block runs on the
    FP8 tensor cores; NVFP4 and MXFP8 are decoded (no FP4 MMA, and an FP8 dot per 32-wide block ran at 0.10x
    BF16), so they stay off Hopper's menu: they save memory there, not time."""

    name: str
    nvfp4_pflops: float
    mxfp8_pflops: float
    bf16_pflops: float
    hbm_tbs: float
    formats: tuple[str, ...]
    native: tuple[str, ...]
    fp8_pflops: float = 0.0
    note: str = ""

    def pflops(self, fmt: str) -> float:
        """The tensor throughput a GEMM in ``fmt`` runs at here (a decoded format runs at BF16's)."""
        name = get_format(fmt).name
        if name != "bf16" and not self.decodes(name):
            return {"nvfp4": self.nvfp4_pflops, "mxfp8": self.mxfp8_pflops, "mxfp8_e5m2": self.mxfp8_pflops,
                    "fp8_block": self.fp8_pflops}[name]
        return self.bf16_pflops

    def decodes(self, fmt: str) -> bool:
        """Whether a block format is decoded to bf16 in memory before a BF16 GEMM here."""
        f = get_format(fmt)
        return f.quantized and f.name not in self.native


BLACKWELL_MENU = ("bf16", "nvfp4", "mxfp8")
BLACKWELL_NATIVE = ("nvfp4", "mxfp8", "mxfp8_e5m2")
HARDWARE = {
    "gb300": Hardware("gb300", 15.0, 5.0, 2.5, 8.0, BLACKWELL_MENU, BLACKWELL_NATIVE,
                      note="Blackwell Ultra dense figures"),
    "b200": Hardware("b200", 9.0, 4.5, 2.25, 8.0, BLACKWELL_MENU, BLACKWELL_NATIVE, note="Blackwell dense figures"),
    "h100": Hardware("h100", 0.99, 0.99, 0.99, 3.35, ("bf16", "fp8_block"), ("fp8_block",), fp8_pflops=1.98,
                     note="H100/H200 SXM dense figures: FP8-block on the FP8 tensor cores; NVFP4 and MXFP8 decoded "
                          "to bf16"),
}


# the table that describes autoprec's kernels on each CUDA compute capability (sm_100: B200 / GB200; sm_103:
# B300 / GB300; sm_90: H100 / H200)
TABLE_OF_CAPABILITY = {(9, 0): "h100", (10, 0): "b200", (10, 3): "gb300"}


def device_note(hardware: str, capability: tuple[int, int], name: str) -> str | None:
    """What a plan costed for ``hardware`` says when it runs on the GPU ``name`` of ``capability``: nothing where
    its table is that GPU's, else which table is (or that none describes the GPU)."""
    table = TABLE_OF_CAPABILITY.get(tuple(capability))
    if table == hardware:
        return None
    other = f"hardware={table!r} costs it for this GPU" if table else "no cost table describes this GPU's kernels"
    return (f"running on {name} (sm_{capability[0]}{capability[1]}): the projected speedups are for "
            f"hardware={hardware!r}; {other}")


def get_hardware(name: str) -> Hardware:
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; valid: {closest(name, list(HARDWARE))}")
    return HARDWARE[name]


def gemm_seconds(flops: float, operand_elems: float, out_elems: float, fmt: str, hw: Hardware) -> float:
    """Projected time of one GEMM in ``fmt``: roofline of math and the bytes it reads and writes, plus for block
    formats the quantization's write of codes and scales (and, where ``hw.decodes``, the decoding's read of
    them and write of bf16 operands)."""
    f = get_format(fmt)
    stored = operand_elems * f.bits_per_value / 8
    decoded = hw.decodes(f.name)
    read = operand_elems * 2.0 if decoded else stored
    bandwidth = hw.hbm_tbs * 1e12
    roofline = max(flops / (hw.pflops(fmt) * 1e15), (read + out_elems * 2.0) / bandwidth)
    extra = (stored + (stored + read if decoded else 0.0)) if f.quantized else 0.0
    return roofline + extra / bandwidth
