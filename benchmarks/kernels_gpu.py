"""GPU throughput of the Triton kernels: quantize GB/s and block-scaled matmul TFLOP/s.

    python benchmarks/kernels_gpu.py [--size 8192] [--hbm-tbs 4.8] [--bf16-tflops 989]

Quantize GB/s counts bytes read (input, plus the random bits for SR) and written (codes and scales).
Matmul TFLOP/s is 2·M·N·K / time, next to torch's bf16 matmul on the same shape. The peaks default
to the H200 (HBM3e 4.8 TB/s, dense BF16 989 TFLOP/s). Without a CUDA GPU it exits with a message.
"""
from __future__ import annotations

import argparse
import sys

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--hbm-tbs", type=float, default=4.8)
    parser.add_argument("--bf16-tflops", type=float, default=989.0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("kernels_gpu.py needs a CUDA GPU; none is visible here (the CPU interpreter is for tests only)")
    import triton.testing

    from autoprec.kernels import quantize, scaled_mm
    from autoprec.kernels.quantized import sr_bits

    n = args.size
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    print(f"{torch.cuda.get_device_name()}  x: {n}x{n} bf16")
    print(f"{'quantize':<28}{'ms':>9}{'GB/s':>9}{'% HBM':>8}")
    rand = sr_bits(x.shape, 0, "cuda")
    cases = [
        ("nvfp4 rows", dict(fmt="nvfp4", axis=1)),
        ("nvfp4 cols (wgrad copy)", dict(fmt="nvfp4", axis=0)),
        ("nvfp4 16x16", dict(fmt="nvfp4", axis=1, tile2d=True)),
        ("nvfp4 rows sr", dict(fmt="nvfp4", axis=1, rounding="sr", rand=rand)),
        ("nvfp4 cols sr + rht", dict(fmt="nvfp4", axis=0, rounding="sr", rand=rand, rht=True)),
        ("mxfp8 rows", dict(fmt="mxfp8", axis=1)),
        ("mxfp8 cols", dict(fmt="mxfp8", axis=0)),
        ("mxfp8_e5m2 rows sr", dict(fmt="mxfp8_e5m2", axis=1, rounding="sr", rand=rand)),
    ]
    for name, kw in cases:
        q = quantize(x, **kw)
        ms = triton.testing.do_bench(lambda: quantize(x, **kw))
        moved = x.nbytes + q.codes.nbytes + q.scales.nbytes + (rand.nbytes if "rand" in kw else 0)
        gbs = moved / ms / 1e6
        print(f"{name:<28}{ms:>9.3f}{gbs:>9.0f}{100 * gbs / (args.hbm_tbs * 1e3):>7.0f}%")

    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    flops = 2 * n**3
    ms_bf16 = triton.testing.do_bench(lambda: x @ w)
    print(f"\n{'matmul':<28}{'ms':>9}{'TFLOP/s':>9}{'x torch':>8}{'% peak':>8}")
    print(f"{'torch bf16':<28}{ms_bf16:>9.3f}{flops / ms_bf16 / 1e9:>9.0f}{1.0:>8.2f}"
          f"{100 * flops / ms_bf16 / 1e9 / args.bf16_tflops:>7.0f}%")
    for fa, fb in [("nvfp4", "nvfp4"), ("mxfp8", "mxfp8"), ("bf16", "bf16")]:
        a = x if fa == "bf16" else quantize(x, fa, 1)
        b = w if fb == "bf16" else quantize(w, fb, 0)
        ms = triton.testing.do_bench(lambda: scaled_mm(a, b, out_dtype=torch.bfloat16))
        tf = flops / ms / 1e9
        print(f"{'autoprec ' + fa + ' x ' + fb:<28}{ms:>9.3f}{tf:>9.0f}{ms_bf16 / ms:>8.2f}"
              f"{100 * tf / args.bf16_tflops:>7.0f}%")


if __name__ == "__main__":
    main()
