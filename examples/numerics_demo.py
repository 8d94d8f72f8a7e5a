"""Quantize a weight and an activation in every format and show what each costs and keeps.

    OMP_NUM_THREADS=1 python examples/numerics_demo.py
"""
from __future__ import annotations

import torch

from autoprec.formats import FORMATS
from autoprec.kernels import fake_quantize_ref, qmm_ref, quantize_ref


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    return float(10 * torch.log10(ref.pow(2).sum() / (approx - ref).pow(2).sum()))


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 512, generator=gen)  # activations: tokens x features
    w = torch.randn(384, 512, generator=gen) * 0.02  # nn.Linear weight: out x in
    y = x @ w.t()
    print(f"fprop Y = X·Wᵀ with X {tuple(x.shape)}, W {tuple(w.shape)}")
    print(f"{'format':<12}{'bits/value':>11}{'X bytes':>10}{'SQNR(X) dB':>12}{'SQNR(Y) dB':>12}")
    for name, fmt in FORMATS.items():
        if fmt.quantized:
            nbytes = quantize_ref(x, fmt).nbytes
        else:
            nbytes = x.to(torch.bfloat16).nbytes
        xq = fake_quantize_ref(x, fmt)
        yq = qmm_ref(x, w.t(), fmt, fmt)
        print(f"{name:<12}{fmt.bits_per_value:>11.2f}{nbytes:>10}{sqnr_db(x, xq):>12.1f}{sqnr_db(y, yq):>12.1f}")
    yh = qmm_ref(x, w.t(), "nvfp4", "nvfp4", rht=True, rounding_a="sr", rounding_b="sr")
    print(f"nvfp4 with RHT + stochastic rounding (the wgrad recipe): SQNR(Y) {sqnr_db(y, yh):.1f} dB")


if __name__ == "__main__":
    main()
