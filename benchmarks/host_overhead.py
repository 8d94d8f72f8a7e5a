"""Host time of the graph's ops on the GPU path, without a GPU: ``torch.ops.autoprec.quantize`` and ``scaled_mm``
run their Python (dispatch, checks, launch setup) with every Triton kernel replaced by a launcher that does
nothing and matmuls dispatched as on sm_90 (the decoded path). What is timed is the per-op cost a GPU step
pays on its CPU unless CUDA graphs replay it; Triton's own launch cost and the cuBLAS call are not included.
``OMP_NUM_THREADS=1 python benchmarks/host_overhead.py``."""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton's Python runs on CPU tensors; the kernels never do
os.environ["AUTOPREC_KERNELS"] = "triton"

import torch  # noqa: E402

import autoprec  # noqa: E402, F401  (registers torch.ops.autoprec)
from autoprec.kernels import dispatch, quantize_triton, scaled_mm_decoded, scaled_mm_triton  # noqa: E402

KERNELS = {quantize_triton: ("_nvfp4_kernel", "_mxfp8_kernel", "_amax_kernel"),
           scaled_mm_decoded: ("_decode_kernel", "_epilogue_kernel"), scaled_mm_triton: ("scaled_mm_kernel",)}


class _NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def per_call_us(fn, calls: int) -> float:
    for _ in range(max(calls // 10, 10)):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    for module, names in KERNELS.items():
        for name in names:
            setattr(module, name, _NoLaunch())
    dispatch.gemm_path = lambda capability, a, b: ("decoded", None)  # what an H100/H200 runs
    x, w, step = torch.randn(64, 64), torch.randn(64, 64), torch.tensor(5)  # small: the fp32 product is run
    quantize, scaled_mm = torch.ops.autoprec.quantize.default, torch.ops.autoprec.scaled_mm.default
    rows = quantize(x, "nvfp4", 1, "rne", 3, False, "rceil", False, 0, step)
    cols = quantize(w, "nvfp4", 0, "rne", 3, False, "rceil", False, 0, step)
    mx_rows = quantize(x, "mxfp8", 1, "rne", 3, False, "rceil", False, 0, step)
    mx_cols = quantize(w, "mxfp8", 0, "rne", 3, False, "rceil", False, 0, step)
    ops = {
        "quantize nvfp4 rows, RNE": lambda: quantize(x, "nvfp4", 1, "rne", 3, False, "rceil", False, 0, step),
        "quantize nvfp4 cols, SR + RHT": lambda: quantize(x, "nvfp4", 0, "sr", 3, False, "rceil", True, 0, step),
        "quantize mxfp8 rows, RNE": lambda: quantize(x, "mxfp8", 1, "rne", 3, False, "rceil", False, 0, step),
        "scaled_mm nvfp4 x nvfp4": lambda: scaled_mm(*rows, "nvfp4", *cols, "nvfp4", 1, None, torch.bfloat16),
        "scaled_mm mxfp8 x mxfp8": lambda: scaled_mm(*mx_rows, "mxfp8", *mx_cols, "mxfp8", 1, None, torch.bfloat16),
    }
    print(f"host time per op call, Triton launches replaced by no-ops ({args.calls} calls each)")
    for name, fn in ops.items():
        print(f"  {name:<32}{per_call_us(fn, args.calls):8.1f} us")


if __name__ == "__main__":
    main()
