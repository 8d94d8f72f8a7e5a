"""Host time of the graph's ops on the GPU path, without a GPU: ``torch.ops.autoprec.quantize`` and ``scaled_mm``
run their Python (dispatch, checks, launch setup) with every Triton kernel replaced by a launcher that does
nothing and matmuls dispatched as on sm_90 (the decoded path). What is timed is the per-op cost a GPU step
pays on its CPU unless CUDA graphs replay it; Triton's own launch cost and the cuBLAS call are not included.
``--step`` also times whole training steps of an 8-layer GPT compiled with inductor, unplanned and under autoprec's
plans (and counts autoprec's Triton launches a step makes: Triton's own dispatch of each, not timed here, costs a
GPU's host about 10 us), at a width (d=64) and in a dtype (fp32) where the CPU's arithmetic is small next to the
host's per-op work: the step's host time, a floor under its time on a GPU without CUDA graphs (the GPU cannot run
ahead of its launches). Not bf16: a CPU without bf16 matmul instructions spends about 10x an fp32 product's time in
a bf16 one (323 against 29 us per matmul of this model on a 2-core machine), which would bury the host's work in the
unplanned step.
``OMP_NUM_THREADS=1 python benchmarks/host_overhead.py [--step]``."""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton's Python runs on CPU tensors; the kernels never do
os.environ["AUTOPREC_KERNELS"] = "triton"

import torch  # noqa: E402
from triton.runtime import interpreter  # noqa: E402
from triton.runtime.jit import KernelInterface  # noqa: E402

import autoprec  # noqa: E402, F401  (registers torch.ops.autoprec)
import autoprec.kernels  # noqa: E402
from autoprec.kernels.dispatch import dense as dispatch  # noqa: E402
from autoprec.kernels.dispatch import grouped as grouped_dispatch  # noqa: E402
from autoprec.kernels.dispatch.grouped_mm import grouped_mm  # noqa: E402
from autoprec.kernels.triton import grouped_mm as grouped_mm_triton  # noqa: E402
from autoprec.kernels.triton import quantize as quantize_entry  # noqa: E402
from autoprec.kernels.triton import quantize_cols as quantize_cols_triton  # noqa: E402
from autoprec.kernels.triton import quantize_grouped as quantize_grouped_triton  # noqa: E402
from autoprec.kernels.triton import quantize_k_groups as quantize_k_groups_triton  # noqa: E402
from autoprec.kernels.triton import quantize_rows as quantize_triton  # noqa: E402
from autoprec.kernels.triton import scaled_mm_decoded  # noqa: E402


class _NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` does nothing; ``LAUNCHES`` counts the calls."""

    LAUNCHES = 0

    def __getitem__(self, grid):
        _NoLaunch.LAUNCHES += 1
        return lambda *args, **kwargs: None


def stub_kernels() -> None:
    """Replace every Triton kernel of autoprec.kernels' modules by a ``_NoLaunch`` (found, not listed: a new
    kernel cannot slip into the timings), and make a kernel that still runs an error."""
    for info in pkgutil.walk_packages(autoprec.kernels.__path__, prefix="autoprec.kernels."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, KernelInterface):
                setattr(module, name, _NoLaunch())

    def refuse(self, *args, **kwargs):
        raise RuntimeError(f"host_overhead: Triton kernel {self.fn.__name__} ran (not replaced by a no-op)")

    interpreter.GridExecutor.__call__ = refuse


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
    parser.add_argument("--step", action="store_true", help="also time training steps of an 8-layer GPT")
    parser.add_argument("--experts", type=int, default=0, help="with --step: MoE MLPs of this many experts")
    args = parser.parse_args()
    stub_kernels()
    dispatch.gemm_path = lambda capability, a, b: ("decoded", None)  # what an H100/H200 runs
    grouped_dispatch.grouped_gemm_path = lambda *args: ("decoded_grouped", None)  # as sm_90 runs 2d x 3d, 2d x 2d
    dispatch.quantize_dual = dispatch.quantize_copies  # as on a GPU: two single quantizations
    per_op(args.calls)
    if args.step:
        steps(experts=args.experts)


def per_op(calls: int) -> None:
    """Host time per call of each autoprec op."""
    x, w, step = torch.randn(64, 64), torch.randn(64, 64), torch.tensor(5)  # small: the fp32 product is run
    tokens, experts = torch.randn(8 * 64, 64), torch.randn(8, 64, 64)  # 64 tokens per expert, fprop (2d x 3d)
    offs = torch.arange(64, 8 * 64 + 1, 64, dtype=torch.int32)
    quantize, scaled_mm = torch.ops.autoprec.quantize.default, torch.ops.autoprec.scaled_mm.default
    rows = quantize(x, "nvfp4", 1, "rne", 3, False, "rceil", False, 0, step)
    cols = quantize(w, "nvfp4", 0, "rne", 3, False, "rceil", False, 0, step)
    mx_rows = quantize(x, "mxfp8", 1, "rne", 3, False, "rceil", False, 0, step)
    mx_cols = quantize(w, "mxfp8", 0, "rne", 3, False, "rceil", False, 0, step)
    heads = torch.randn(16, 64, 64)  # a bmm over 16 attention heads (eager attention's scores)
    q_heads = quantize(heads, "nvfp4", 2, "rne", 3, False, "rceil", False, 0, step)
    k_heads = quantize(heads, "nvfp4", 1, "rne", 3, False, "rceil", False, 0, step)
    ops = {
        "quantize nvfp4 rows, RNE": lambda: quantize(x, "nvfp4", 1, "rne", 3, False, "rceil", False, 0, step),
        "quantize nvfp4 cols, SR + RHT": lambda: quantize(x, "nvfp4", 0, "sr", 3, False, "rceil", True, 0, step),
        "quantize mxfp8 rows, RNE": lambda: quantize(x, "mxfp8", 1, "rne", 3, False, "rceil", False, 0, step),
        "scaled_mm nvfp4 x nvfp4": lambda: scaled_mm(*rows, "nvfp4", *cols, "nvfp4", 1, None, torch.bfloat16),
        "scaled_mm mxfp8 x mxfp8": lambda: scaled_mm(*mx_rows, "mxfp8", *mx_cols, "mxfp8", 1, None, torch.bfloat16),
        "scaled_mm nvfp4, 16 heads (bmm)": lambda: scaled_mm(*q_heads, "nvfp4", *k_heads, "nvfp4", 1, None,
                                                             torch.bfloat16),
        "grouped_mm nvfp4, 8 experts": lambda: grouped_mm(tokens, experts, offs, "nvfp4", rounding_a="sr", step=step,
                                                          out_dtype=torch.bfloat16),
        "grouped_mm nvfp4, batch of 8 (3d)": lambda: grouped_mm(tokens.view(8, 64, 64), experts, None, "nvfp4",
                                                                rounding_a="sr", step=step, out_dtype=torch.bfloat16),
    }
    print(f"host time per op call, Triton launches replaced by no-ops ({calls} calls each)")
    for name, fn in ops.items():
        print(f"  {name:<32}{per_call_us(fn, calls):8.1f} us")


def steps(layers: int = 8, timed: int = 20, experts: int = 0) -> None:
    """Milliseconds per forward + backward of a d=64 GPT (the op count of any width; ``experts``: MoE MLPs) under
    inductor: unplanned (fp32), then each plan, with the number of quantizations, Triton NVFP4 tensor amax passes
    (the graph computes those without the RHT: passes/graph_amax.py) and block-scaled matmuls a step makes (a grouped
    quantization counts once), and of autoprec's Triton launches."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from gpt_model import TinyGPT, tokens

    idx, tgt = tokens(batch=1, ctx=64, vocab=512)
    name = f"GPT {layers}x64" + (f", {experts} experts" if experts else "")
    print(f"\n{'training step, ' + name + ' under inductor (CPU)':<50}{'ms':>8}{'x fp32':>8}{'quantize':>10}"
          f"{'amax':>6}{'matmul':>8}{'launches':>10}")
    base = None
    for recipe in (None, "nvfp4", "nvfp4_nvidia", "mxfp8"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = TinyGPT(vocab=512, d=64, layers=layers, heads=4, ctx=64, sdpa=True, experts=experts)
        compiled = torch.compile(model) if recipe is None else torch.compile(
            model, backend="autoprec", options={"recipe": recipe, "inner": "inductor"})

        def step() -> None:
            compiled(idx, tgt).backward()

        for _ in range(3):  # compile, plan
            step()
        launches = _NoLaunch.LAUNCHES
        quantizes, amaxes, matmuls = _count_calls(step)
        launches = _NoLaunch.LAUNCHES - launches
        ms = per_call_us(step, timed) / 1e3
        base = base or ms
        print(f"  {recipe or 'fp32':<48}{ms:>8.2f}{ms / base:>8.2f}{quantizes:>10}{amaxes:>6}{matmuls:>8}"
              f"{launches:>10}")


def _count_calls(step) -> tuple[int, int, int]:
    """(quantizations, NVFP4 tensor amax passes, block-scaled matmuls) in one ``step``: calls of the Triton
    quantizers, of the whole-tensor amax launches (a pair's shared amax counts once; the grouped quantizers' amax
    kernels are not counted) and of the decoded matmuls (a grouped one counts once)."""
    counts = {}
    targets = ((quantize_entry, "quantize_triton"), (quantize_grouped_triton, "quantize_row_groups_triton"),
               (quantize_grouped_triton, "quantize_batches_triton"), (scaled_mm_decoded, "scaled_mm_decoded"),
               (quantize_k_groups_triton, "quantize_k_groups_triton"), (grouped_mm_triton, "grouped_mm_decoded"),
               (grouped_mm_triton, "grouped_wgrad_decoded"), (quantize_triton, "launch_amax"),
               (quantize_cols_triton, "launch_rht_amax"))
    saved = [getattr(module, name) for module, name in targets]

    def counted(name, fn):
        def run(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return fn(*args, **kwargs)
        return run

    for (module, name), fn in zip(targets, saved):
        setattr(module, name, counted(name, fn))
    try:
        step()
    finally:
        for (module, name), fn in zip(targets, saved):
            setattr(module, name, fn)
    quantizes = sum(counts.get(name, 0) for name in ("quantize_triton", "quantize_row_groups_triton",
                                                      "quantize_batches_triton", "quantize_k_groups_triton"))
    amaxes = counts.get("launch_amax", 0) + counts.get("launch_rht_amax", 0)
    return quantizes, amaxes, sum(counts.get(name, 0) for name in ("scaled_mm_decoded", "grouped_mm_decoded",
                                                                   "grouped_wgrad_decoded"))


if __name__ == "__main__":
    main()
