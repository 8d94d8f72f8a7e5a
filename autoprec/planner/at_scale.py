"""At-scale cost projection: a plan's per-GEMM formats costed at a reference model's shapes, at the
speedups Transformer Engine measured there rather than at peak ratios.

A small model's GEMMs (d=128) are memory-bound, so their roofline says little about the trade-off a
4096-wide model faces. Each traced GEMM is mapped onto the reference model: the traced width d becomes
``d_model``, the traced MLP width ``ffn``, any other weight dim scales by d_model / d (a fused QKV of 3d
becomes 3 d_model), tokens become the reference's token count, and attention products also scale with
the sequence length and the width (their FLOPs grow as tokens x seq x width). At those shapes the GEMMs
are compute-bound and each format runs at its measured speedup over BF16, quantization included:

- NVIDIA B300, Transformer Engine's 5B model (hidden 4096, intermediate 16384, 24 layers, micro-batch 31
  x sequence 512 = 15872 tokens), "autocast" (GEMM + per-step quantization): MXFP8 1.44x, NVFP4 2.03x
  BF16; without the quantization ("pre-quantized") NVFP4 3.55x.
  https://nvidia.github.io/TransformerEngine/features/low_precision_training/speedups.html
- Efficiency against the peak ratios (15 / 5 / 2.5 PFLOPS): NVFP4 2.03 / 6 = 0.34, MXFP8 1.44 / 2 = 0.72.
  No figure is published for B200 here: it takes the B300 ratios.
- H100/H200 (``h100``), NVFP4 and MXFP8: autoprec's own sm_90 GEMMs (operands decoded to bf16, cuBLAS) at 8192^3
  against torch's bf16 GEMM, the quantization of both operands included, as the one GPU run measured them
  (``benchmarks/results/h200_2026-12-04.txt``; how the MXFP8 rate is composed: ``gpu_log.md``). Slower than BF16:
  on Hopper those formats save memory, not time, and a plan says so.
- H100/H200, FP8-block: no end-to-end figure for 1x128 / 128x128 block scaling is published; torchao measured
  float8 rowwise training at 1.34-1.43x BF16 on 2K H200s (Llama-3 70B, torchtitan;
  https://github.com/pytorch/ao, news of April 2025) and NVIDIA's NeMo FP8 post reports 128x128 block scaling a
  little below per-tensor scaling's throughput on H100
  (https://developer.nvidia.com/blog/faster-training-throughput-in-fp8-precision-with-nvidia-nemo). The table takes
  the low end, 1.34x. Those are whole training steps (attention and the rest included), so the GEMMs' own speedup is
  at least that; autoprec's sm_90 blockwise GEMM has not been timed yet (``docs/gpu.md``).
- A format a hardware decodes to bf16 and no table measures (FP8-block on Blackwell) takes the decoded MXFP8 rate
  measured on sm_90.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from autoprec.formats import get_format

from .cost import Hardware

DECODED_RATE = 0.70  # an 8-bit format decoded to bf16 on sm_90, quantization included (MXFP8's row below)
TE_B300 = {"bf16": 1.0, "mxfp8": 1.44, "nvfp4": 2.03}  # measured with quantization (source above)
SM90 = {"bf16": 1.0, "mxfp8": DECODED_RATE, "nvfp4": 0.47, "fp8_block": 1.34}  # sources above
MEASURED = {"gb300": TE_B300, "b200": TE_B300, "h100": SM90}
_MEASURED_BY = {"gb300": "TE's measured B300 speedups", "b200": "TE's measured B300 speedups",
                "h100": "torchao's H200 FP8 training and autoprec's decoded sm_90 GEMMs"}
# the plan's at-scale line: who measured each table's rates, and the rates
SOURCES = {hw: f"{by} with quantization: " + ", ".join(f"{fmt.upper()} {rate:.2f}x"
                                                          for fmt, rate in MEASURED[hw].items() if fmt != "bf16")
           for hw, by in _MEASURED_BY.items()}


def measured_rate(hw: str, fmt: str) -> float:
    """The at-scale speedup over BF16 of a GEMM in ``fmt`` on hardware table ``hw`` (MXFP8's for its E5M2 variant;
    ``DECODED_RATE`` for a format the table does not measure, which that hardware decodes)."""
    name = get_format(fmt).name
    return MEASURED[hw].get("mxfp8" if name == "mxfp8_e5m2" else name, DECODED_RATE)


@dataclass(frozen=True)
class ReferenceShapes:
    """The model the projection costs the plan at (default: Transformer Engine's measured 5B model)."""

    d_model: int = 4096
    ffn: int = 16384
    tokens: int = 15872
    seq: int = 512

    def describe(self) -> str:
        return f"d_model {self.d_model}, ffn {self.ffn}, {self.tokens} tokens, seq {self.seq}"


def _mode(values: list[int], default: int) -> int:
    return Counter(values).most_common(1)[0][0] if values else default


class AtScale:
    """The projection for one model, from its GEMM specs (their weights tell the traced d and ffn, their
    forward GEMMs the traced tokens and sequence length)."""

    def __init__(self, specs: list, ref: ReferenceShapes, hw: Hardware) -> None:
        self.ref, self.hw = ref, hw
        weighted = [s for s in specs if s.weight_shape is not None and len(s.weight_shape) >= 2]
        dims = [d for s in weighted for d in s.weight_shape[-2:]]
        self.d = max(1, _mode(dims, 1))
        self.ffn = _mode([x for x in dims if x != self.d], self.d)
        fprops = [s for s in specs if str(s.role) == "fprop"]
        # sizes of 0 (an empty batch) count as 1: such a GEMM has no FLOPs to scale anyway
        self.tokens = max(1, _mode([s.dims[1] for s in fprops if s in weighted and s.groups is None], 1))
        self.seq = max(1, _mode([s.dims[1] for s in fprops if s not in weighted and s.dims[0] > 1], self.tokens))

    def _width(self, w: int) -> float:
        """A traced weight dim at the reference's width (1 for a zero-sized dim: its GEMM has no FLOPs)."""
        if w == 0:
            return 1.0
        if w == self.d:
            return self.ref.d_model
        if w == self.ffn:
            return self.ref.ffn
        return w * self.ref.d_model / self.d

    def flops(self, spec) -> float:
        """The GEMM's FLOPs at the reference shapes."""
        tokens = self.ref.tokens / self.tokens
        if spec.weight_shape is not None and len(spec.weight_shape) >= 2:
            a, b = spec.weight_shape[-2:]
            return spec.flops() * tokens * self._width(a) / max(a, 1) * self._width(b) / max(b, 1)
        return spec.flops() * tokens * (self.ref.seq / self.seq) * (self.ref.d_model / self.d)

    def seconds(self, spec, fmt: str) -> float:
        """Time at the reference shapes: compute-bound BF16 at peak, divided by the format's measured speedup."""
        return self.flops(spec) / (self.hw.pflops("bf16") * 1e15) / measured_rate(self.hw.name, fmt)
