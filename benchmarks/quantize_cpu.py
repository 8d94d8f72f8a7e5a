"""CPU cost of quantize + dequantize per format: the fused C kernels (the default on CPU) and the
pure-torch reference, in ns per element, next to a plain bf16 copy.

    OMP_NUM_THREADS=1 python benchmarks/quantize_cpu.py [--size 4096] [--repeats 3]

GB/s counts the fp32 input once (4 bytes per value): how fast each path consumes a tensor.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from autoprec.kernels import dequantize, dequantize_ref, quantize, quantize_ref, rht_ref  # noqa: E402

CASES = [
    ("nvfp4 1x16 rne", "nvfp4", {}),
    ("nvfp4 16x16 rne", "nvfp4", {"tile2d": True}),
    ("nvfp4 1x16 sr", "nvfp4", {"rounding": "sr"}),
    ("nvfp4 1x16 sr+rht", "nvfp4", {"rounding": "sr", "rht": True}),
    ("mxfp8 e4m3 rceil", "mxfp8", {}),
    ("mxfp8 e4m3 floor", "mxfp8", {"scale_mode": "floor"}),
    ("mxfp8 e5m2 rceil", "mxfp8_e5m2", {}),
    ("mxfp8 e4m3 sr", "mxfp8", {"rounding": "sr"}),
]


def best_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    x = torch.randn(args.size, args.size, generator=torch.Generator().manual_seed(0))
    n = x.numel()
    print(f"{args.size}x{args.size} fp32, torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    print(f"{'quantize + dequantize':<24}{'fused ns/elt':>13}{'GB/s':>8}{'ref ns/elt':>12}{'x bf16 copy':>13}")
    copy = best_seconds(lambda: x.to(torch.bfloat16), args.repeats)
    print(f"{'x.to(bfloat16)':<24}{copy / n * 1e9:>13.2f}{n * 4 / 1e9 / copy:>8.2f}{'':>12}{1.0:>13.1f}")
    for name, fmt, opts in CASES:
        fused = best_seconds(lambda: dequantize(quantize(x, fmt, **opts)), args.repeats)
        ref_opts = {k: v for k, v in opts.items() if k != "rht"}
        src = rht_ref(x, -1) if opts.get("rht") else x
        reference = best_seconds(lambda: dequantize_ref(quantize_ref(src, fmt, **ref_opts)), args.repeats)
        print(f"{name:<24}{fused / n * 1e9:>13.2f}{n * 4 / 1e9 / fused:>8.2f}{reference / n * 1e9:>12.2f}"
              f"{fused / copy:>13.1f}")


if __name__ == "__main__":
    main()
