"""GPU throughput of the Triton kernels and of a planned training step.

    python benchmarks/kernels_gpu.py [--size 8192] [--hbm-tbs 4.8] [--bf16-tflops 989] [--layers 24]
                                     [--compile blocks|whole] [--no-step | --step-only] [--profile] [--graphs]
                                     [--dry-run]

Quantize GB/s counts the input once (NVFP4's amax pass reads it again) and the bytes written (codes and
scales); SR bits are hashed in the kernels. "both" rows write the rowwise and columnwise copies as dispatch
makes them (two quantizations on a GPU for now; "rne", the nvfp4 recipe's pairs, with one amax pass for both),
"one read" rows from one read by the one-read kernel; "fp8_block" rows Hopper's format (1x128 blocks along rows or
down columns, a weight's 128x128 tiles; one Triton kernel, not autotuned).
Matmul TFLOP/s is 2·M·N·K / time at 4096³ and 8192x8192x2048 (and --size³), next to torch's bf16 matmul on the
same shape, alone and with both operands' quantization (first FP8-block: cuBLAS's blockwise GEMM, sm_90 only; the
target there is 1.5x torch's bf16 with quantization); each row names the path dispatch took (native, decoded,
tensor_core, fp32; "dec" with the product the decoded path timed faster at its first call), and beside it the
in-register Triton GEMM and the decoded path's two products alone: cuBLAS's (an fp32 product, then the epilogue
pass) and Triton's GEMM (its epilogue in registers, no fp32 product in memory; --sweep: at several tiles), and that
GEMM reading its tiles with the TMA (a candidate dispatch does not take yet; --sweep: at several tiles). Grouped
rows time an experts fprop and wgrad (8 experts, bf16 out, quantization included) against torch's bf16 grouped
GEMM, naming its path (one native grouped GEMM on sm_100, else one Triton launch), beside rows forced to one GEMM
per group, and autoprec's bf16 grouped product (torch's, plus zeroing what it leaves undefined; into fp32,
Triton's one-launch kernels); bmm rows time a planned batched product (attention scores, 64 items) against torch's
bf16 bmm; grouped quantize rows time the fprop's token groups and expert weights quantized in one pass each
against one quantization per group.
The step is one forward+backward of a ~350M-parameter GPT (24 layers, d=1024, ctx 1024, batch 8) in bf16 under
plain inductor, against autoprec's nvfp4, mxfp8, auto, fp8_block and auto-on-Hopper's-menu (hardware="h100",
cost="at_scale") plans (inner inductor), each compiled as torchtitan does:
every block and the head on its own (--compile blocks; the embeddings and the loss run eagerly in every row), so
blocks planned alike share one compile and the warm-up grows far less with the layers (--compile whole: the model
as one graph, as the first GPU run did at 8 layers); --graphs adds the bf16, nvfp4, fp8_block and Hopper-auto
steps under mode="reduce-overhead" (CUDA graphs, which remove the per-op host time benchmarks/host_overhead.py
measures). The peaks default to the H200 (HBM3e 4.8 TB/s, dense BF16 989 TFLOP/s). Targets (docs/gpu.md): quantize >=
70% of HBM peak, planned GEMMs >= 90% of torch bf16, a planned step <= 1.15x the bf16 step.
Without a CUDA GPU it exits with a message, unless --dry-run: every section then runs once on the CPU at tiny
shapes, its Triton kernels in the interpreter (AUTOPREC_KERNELS=triton: matmuls take the in-register GEMM, so the
rows only the decoded path has are left out), which checks the script's calls before a GPU session spends its
time on them; its numbers time nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import torch
from gpu_rig import DRY, Rig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--hbm-tbs", type=float, default=4.8)
    parser.add_argument("--bf16-tflops", type=float, default=989.0)
    parser.add_argument("--layers", type=int, default=24, help="layers of the d=1024 GPT timed for one step")
    parser.add_argument("--compile", choices=("blocks", "whole"), default="blocks",
                        help="the step's model compiled block by block (and its head), or as one graph")
    parser.add_argument("--no-step", action="store_true", help="skip the training-step comparison")
    parser.add_argument("--sweep", action="store_true", help="time the tensor-core GEMM's tile configurations")
    parser.add_argument("--profile", action="store_true", help="profile one step of each plan (top GPU ops)")
    parser.add_argument("--step-only", action="store_true", help="only the training-step comparison")
    parser.add_argument("--graphs", action="store_true",
                        help="also time the bf16 and nvfp4 steps under mode='reduce-overhead' (CUDA graphs)")
    parser.add_argument("--dry-run", action="store_true",
                        help="every section once on the CPU at tiny shapes: checks the script, times nothing")
    args = parser.parse_args()
    if args.dry_run:  # before anything imports Triton
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["AUTOPREC_KERNELS"] = "triton"  # the Triton kernels a GPU runs, not the CPU's C ones
        rig, n = DRY, 128
        print("dry run on the CPU: tiny shapes, Triton's interpreter; the numbers below time nothing")
    elif not torch.cuda.is_available():
        sys.exit("kernels_gpu.py needs a CUDA GPU; none is visible here (--dry-run checks the script on a CPU)")
    else:
        rig, n = Rig(), args.size
    if args.step_only:
        training_step(rig, args.layers, args.compile == "blocks", args.profile, args.graphs)
        return
    from autoprec.formats import get_format
    from autoprec.kernels import quantize
    from autoprec.kernels.core.launch import hardware_fp8, nvfp4_hardware
    from autoprec.kernels.core.quantized import QuantCopy
    from autoprec.kernels.core.random_bits import sr_stream
    from autoprec.kernels.dispatch.dense import quantize_dual
    from autoprec.kernels.triton import quantize_cols as qc
    from autoprec.kernels.triton import quantize_dual as qd
    from autoprec.kernels.triton import quantize_rows as qt
    from autoprec.kernels.triton.quantize_dual import quantize_dual_triton

    x = torch.randn(n, n, device=rig.device, dtype=torch.bfloat16)
    nvfp4 = ("none", "block scales", "block scales and elements")[nvfp4_hardware(x.device)]
    print(f"{'CPU' if rig.dry else torch.cuda.get_device_name()}  x: {n}x{n} bf16; round to nearest by the "
          f"hardware's conversion: MXFP8 {hardware_fp8(x.device)}, NVFP4 {nvfp4}")
    print(f"{'quantize':<28}{'ms':>9}{'GB/s':>9}{'% HBM':>8}  tile (BRxBK/warps) the autotuner chose")
    seed = sr_stream(1, 1)
    cases = [
        ("nvfp4 rows", dict(fmt="nvfp4", axis=1)),
        ("nvfp4 cols (wgrad copy)", dict(fmt="nvfp4", axis=0)),
        ("nvfp4 16x16", dict(fmt="nvfp4", axis=1, tile2d=True)),
        ("nvfp4 rows sr", dict(fmt="nvfp4", axis=1, rounding="sr", seed=seed)),
        ("nvfp4 cols sr + rht", dict(fmt="nvfp4", axis=0, rounding="sr", seed=seed, rht=True)),
        ("mxfp8 rows", dict(fmt="mxfp8", axis=1)),
        ("mxfp8 cols", dict(fmt="mxfp8", axis=0)),
        ("mxfp8_e5m2 rows sr", dict(fmt="mxfp8_e5m2", axis=1, rounding="sr", seed=seed)),
        ("fp8_block rows", dict(fmt="fp8_block", axis=1)),
        ("fp8_block cols (wgrad copy)", dict(fmt="fp8_block", axis=0)),
        ("fp8_block 128x128", dict(fmt="fp8_block", axis=1, tile2d=True)),
    ]
    duals = [  # an activation (fprop rows, wgrad columns + RHT) and a gradient (SR on both, RHT on columns); the
        # nvfp4 recipe's pairs (both copies round to nearest, no RHT: one amax pass for both on a GPU)
        ("nvfp4 both, rne", "nvfp4", QuantCopy(), QuantCopy()),
        ("nvfp4 both, activation", "nvfp4", QuantCopy(), QuantCopy(rht=True)),
        ("nvfp4 both, gradient", "nvfp4", QuantCopy(seed), QuantCopy(seed + 1, rht=True, transposed_source=True)),
        ("mxfp8 both, activation", "mxfp8", QuantCopy(), QuantCopy()),
    ]
    timed = [(name, lambda kw=kw: [quantize(x, **kw)]) for name, kw in cases]
    timed += [(name, lambda f=f, r=r, c=c: quantize_dual(x, f, r, c)) for name, f, r, c in duals]
    timed += [(name.replace("both", "one read"), lambda f=f, r=r, c=c: quantize_dual_triton(x, get_format(f), r, c))
              for name, f, r, c in duals]
    for name, fn in timed:
        out, ms = rig.output_and_ms(fn)
        written = sum(q.codes.nbytes + q.scales.nbytes for q in out)
        gbs = (x.nbytes + written) / ms / 1e6
        fmt = "nvfp4" if name.startswith("nvfp4") else "mxfp8"  # the autotuned kernel this case launched
        module, kind = (qd, "_dual") if "one read" in name else (qc, "_cols") if "cols" in name else (qt, "")
        fixed = "both" in name or name.startswith("fp8_block")  # two kernels, or one not autotuned
        tile = None if fixed else getattr(module, f"_{fmt}{kind}_kernel").best_config
        chosen = f"  {tile.kwargs['BR']}x{tile.kwargs['BK']}/{tile.num_warps}" if tile is not None else ""
        print(f"{name:<28}{ms:>9.3f}{gbs:>9.0f}{100 * gbs / (args.hbm_tbs * 1e3):>7.0f}%{chosen}")
    inductor_reference(rig, x, cases[:1] if rig.dry else [cases[i] for i in (0, 1, 4, 5, 6)], args.hbm_tbs)

    for m, nn_, k in rig.matmul_shapes + ((n, n, n),):
        matmuls(rig, m, nn_, k, args.bf16_tflops)
    if args.sweep:
        sweep(rig, *rig.matmul_shapes[1], args.bf16_tflops)
    grouped(rig, args.bf16_tflops)
    batched(rig, args.bf16_tflops)
    grouped_quantize(rig, args.hbm_tbs)
    if not args.no_step:
        training_step(rig, args.layers, args.compile == "blocks", args.profile, args.graphs)


def inductor_reference(rig: Rig, x: torch.Tensor, cases: list, hbm_tbs: float) -> None:
    """Each single quantization again as the bit-exact reference compiled by inductor (``AUTOPREC_KERNELS=
    ref_inductor``: inductor's own fused Triton), against the hand-written kernel: which one dispatch should take,
    measured before more kernels are written: rows and columns of both formats and NVFP4's SR + RHT copy on a GPU,
    the first case only in a dry run (inductor's CPU compiles are slow)."""
    from autoprec.kernels import quantize

    print(f"{'quantize, inductor reference':<28}{'ms':>9}{'GB/s':>9}{'% HBM':>8}  against the Triton kernel")
    for name, kw in cases:
        triton_ms = rig.bench(lambda kw=kw: quantize(x, **kw))
        previous = os.environ.get("AUTOPREC_KERNELS")
        os.environ["AUTOPREC_KERNELS"] = "ref_inductor"
        try:
            out, ms = rig.output_and_ms(lambda kw=kw: [quantize(x, **kw)])
        finally:
            os.environ["AUTOPREC_KERNELS"] = previous if previous is not None else "auto"
        gbs = (x.nbytes + sum(q.codes.nbytes + q.scales.nbytes for q in out)) / ms / 1e6
        print(f"{name:<28}{ms:>9.3f}{gbs:>9.0f}{100 * gbs / (hbm_tbs * 1e3):>7.0f}%  {triton_ms / ms:.2f}x the "
              f"Triton kernel's speed")


def matmuls(rig: Rig, m: int, n: int, k: int, peak: float) -> None:
    """TFLOP/s of the planned block-scaled matmuls against torch's bf16 matmul at one shape."""
    from autoprec.kernels import quantize, scaled_mm
    from autoprec.kernels.core.operand import as_operand
    from autoprec.kernels.dispatch.dense import gemm_path
    from autoprec.kernels.triton.scaled_mm_decoded import (
        scaled_mm_decoded_cublas,
        scaled_mm_decoded_tma,
        scaled_mm_decoded_triton,
    )
    from autoprec.kernels.triton.scaled_mm_tc import scaled_mm_tc_triton

    x = torch.randn(m, k, device=rig.device, dtype=torch.bfloat16)
    w = torch.randn(k, n, device=rig.device, dtype=torch.bfloat16)
    flops = 2 * m * n * k
    ms_bf16 = rig.bench(lambda: x @ w)
    print(f"\n{f'matmul {m}x{n}x{k}':<28}{'ms':>9}{'TFLOP/s':>9}{'x torch':>8}{'% peak':>8}")
    print(f"{'torch bf16':<28}{ms_bf16:>9.3f}{flops / ms_bf16 / 1e9:>9.0f}{1.0:>8.2f}"
          f"{100 * flops / ms_bf16 / 1e9 / peak:>7.0f}%")
    capability = rig.capability()
    fp8_block(rig, x, w, flops, ms_bf16, peak)
    for fmt in ("nvfp4", "mxfp8", "bf16"):
        a = x if fmt == "bf16" else quantize(x, fmt, 1)
        b = w if fmt == "bf16" else quantize(w, fmt, 0)
        path, _ = gemm_path(capability, as_operand(a, 1, "a"), as_operand(b, 0, "b"))
        if path == "decoded":  # the first call times cuBLAS's and Triton's products and keeps the faster
            path = f"dec, {chosen_product(lambda: scaled_mm(a, b, out_dtype=torch.bfloat16))}"
        row(rig, f"autoprec {fmt} ({path})", lambda: scaled_mm(a, b, out_dtype=torch.bfloat16), flops, ms_bf16, peak)
        if fmt != "bf16":  # with both operands' quantization, as a step runs it (TE's "with quantization")
            row(rig, "  + quantize x, w", lambda: scaled_mm(quantize(x, fmt, 1), quantize(w, fmt, 0),
                                                        out_dtype=torch.bfloat16), flops, ms_bf16, peak)
        if fmt == "bf16":
            continue
        oa, ob = as_operand(a, 1, "a"), as_operand(b, 0, "b")
        if path != "tensor_core":  # the other sm_90 design: tiles decoded in registers
            row(rig, "  in-register Triton", lambda: scaled_mm_tc_triton(oa, ob, None, torch.bfloat16), flops, ms_bf16,
                peak)
        # the decoded path's two products, each alone: cuBLAS's (then the fp32 product's epilogue pass), and
        # Triton's GEMM with the epilogue in its registers; then the candidate reading its tiles with the TMA
        row(rig, "  decoded + cuBLAS", lambda: scaled_mm_decoded_cublas(oa, ob, None, torch.bfloat16), flops, ms_bf16,
            peak)
        row(rig, "  decoded + Triton GEMM", lambda: scaled_mm_decoded_triton(oa, ob, None, torch.bfloat16), flops,
            ms_bf16, peak)
        if capability >= (9, 0):  # the TMA: Hopper on
            row(rig, "  decoded + Triton TMA GEMM", lambda: scaled_mm_decoded_tma(oa, ob, None, torch.bfloat16),
                flops, ms_bf16, peak)


def fp8_block(rig: Rig, x: torch.Tensor, w: torch.Tensor, flops: int, ms_bf16: float, peak: float) -> None:
    """The FP8-block product (activations in 1x128 blocks, the weight in 128x128 tiles): cuBLAS's blockwise GEMM on
    sm_90, alone and with both quantizations; elsewhere the row says why it does not run."""
    from autoprec.kernels import quantize, scaled_mm
    from autoprec.kernels.core.operand import as_operand
    from autoprec.kernels.cuda.scaled_mm_blockwise import blockwise_problem

    (k, n), why = w.shape, None
    if k % 128 or n % 128:
        why = f"K={k}, N={n}: the weight's 128x128 tiles do not fit"
    else:
        a, b = quantize(x, "fp8_block", 1), quantize(w, "fp8_block", 0, tile2d=True)
        why = blockwise_problem(rig.capability(), as_operand(a, 1, "a"), as_operand(b, 0, "b"))
    if why:
        print(f"{'autoprec fp8_block':<28}  not timed: {why}")
        return
    row(rig, "autoprec fp8_block (cuBLAS)", lambda: scaled_mm(a, b, out_dtype=torch.bfloat16), flops, ms_bf16, peak)
    row(rig, "  + quantize x, w", lambda: scaled_mm(quantize(x, "fp8_block", 1), quantize(w, "fp8_block", 0,
                                                                                           tile2d=True),
                                                    out_dtype=torch.bfloat16), flops, ms_bf16, peak)


def chosen_product(call) -> str:
    """The product(s) the decoded path chose at the keys ``call`` (run once here) met first."""
    from autoprec.kernels.triton import gemm_choice

    before = gemm_choice.chosen()
    call()
    new = {name for key, name in gemm_choice.chosen().items() if key not in before}
    return "/".join(sorted(new)) or "chosen before"


SWEEP = [(128, 128, 32, 8, 3), (128, 128, 64, 8, 3), (128, 256, 32, 8, 3), (64, 128, 64, 4, 3),
         (128, 128, 32, 4, 4), (128, 64, 32, 4, 4), (64, 64, 64, 4, 4), (128, 128, 64, 8, 4)]
DECODED_SWEEP = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 32, 8, 4), (128, 256, 64, 8, 3),
                 (128, 256, 64, 8, 4)]
TMA_SWEEP = [(256, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (256, 128, 64, 8, 4)]


def sweep(rig: Rig, m: int, n: int, k: int, peak: float) -> None:
    """The in-register tensor-core GEMM at each (BM, BN, BK, warps, stages) of SWEEP, then Triton's GEMM over
    decoded operands at each of DECODED_SWEEP, and its TMA-loading twin at each of TMA_SWEEP; the first of each is
    the one it runs."""
    from autoprec.kernels import quantize
    from autoprec.kernels.core.operand import as_operand
    from autoprec.kernels.triton.scaled_mm import bf16_dot, launch
    from autoprec.kernels.triton.scaled_mm_decoded import scaled_mm_decoded_tma, scaled_mm_decoded_triton

    x = torch.randn(m, k, device=rig.device, dtype=torch.bfloat16)
    w = torch.randn(k, n, device=rig.device, dtype=torch.bfloat16)
    ms_bf16 = rig.bench(lambda: x @ w)
    print(f"\n{f'tile sweep {m}x{n}x{k}':<28}{'ms':>9}{'TFLOP/s':>9}{'x torch':>8}{'% peak':>8}")
    gemms = [  # (name tag, tiles, GEMM of (oa, ob, blocks, launch options)): in-register, then decoded operands
        ("", SWEEP, lambda oa, ob, blocks, **opts: launch(blocks, oa, ob, None, torch.bfloat16, bf16_dot(), **opts)),
        ("dec ", DECODED_SWEEP, lambda oa, ob, blocks, **opts: scaled_mm_decoded_triton(oa, ob, None, torch.bfloat16,
                                                                                        blocks=blocks, **opts)),
        ("tma ", TMA_SWEEP, lambda oa, ob, blocks, **opts: scaled_mm_decoded_tma(oa, ob, None, torch.bfloat16,
                                                                                blocks=blocks, **opts))]
    for fmt in ("nvfp4", "mxfp8"):
        oa, ob = as_operand(quantize(x, fmt, 1), 1, "a"), as_operand(quantize(w, fmt, 0), 0, "b")
        for tag, tiles, gemm in gemms:
            for bm, bn, bk, warps, stages in tiles:
                name = f"{fmt} {tag}{bm}x{bn}x{bk} w{warps} s{stages}"
                try:
                    row(rig, name, lambda: gemm(oa, ob, (bm, bn, bk), num_warps=warps, num_stages=stages),
                        2 * m * n * k, ms_bf16, peak)
                except Exception as e:  # a tile that does not fit (shared memory, registers) is reported
                    print(f"{name:<28}  failed: {str(e).splitlines()[0][:80]}")


def row(rig: Rig, name: str, fn, flops: int, ms_bf16: float, peak: float, note: str = "") -> None:
    ms = rig.bench(fn)
    tf = flops / ms / 1e9
    print(f"{name:<28}{ms:>9.3f}{tf:>9.0f}{ms_bf16 / ms:>8.2f}{100 * tf / peak:>7.0f}%{note}")


def expert_operands(rig: Rig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An experts fprop's operands at the rig's sizes: bf16 tokens (T, K), expert weights (E, K, N), and the
    groups' cumulative ends (tokens split evenly)."""
    experts, tokens, width = rig.experts, rig.tokens, rig.width
    x = torch.randn(tokens, width, device=rig.device, dtype=torch.bfloat16)
    w = torch.randn(experts, width, width, device=rig.device, dtype=torch.bfloat16) * 0.02
    offs = torch.arange(1, experts + 1, device=rig.device, dtype=torch.int32) * (tokens // experts)
    return x, w, offs


def grouped(rig: Rig, peak: float) -> None:
    """An experts fprop (2d x 3d) and wgrad (2d x 2d), tokens split evenly, bf16 out, in autoprec's grouped op
    (quantization included) against torch's bf16 grouped GEMM; each row names the path (``native_grouped`` on
    sm_100, else ``decoded_grouped``: one Triton launch), and the ``per group`` rows force one quantization
    (wgrad) and one dense GEMM per group for comparison. The bf16 product into fp32, which torch's grouped GEMM
    does not write, runs Triton's one-launch bf16 kernels."""
    from unittest import mock

    import torch.nn.functional as F

    from autoprec.kernels.dispatch import grouped as grouped_dispatch
    from autoprec.kernels.dispatch.grouped_mm import grouped_mm
    from autoprec.kernels.dispatch.grouped_route import grouped_route

    experts, tokens, k, n = rig.experts, rig.tokens, rig.width, rig.width
    x, w, offs = expert_operands(rig)
    dy = torch.randn(tokens, n, device=rig.device, dtype=torch.bfloat16)
    flops = 2 * tokens * k * n
    for role, layout, a, b in (("fprop", "2d3d", x, w), ("wgrad", "2d2d", x.t(), dy)):
        print(f"\n{'grouped ' + role + ' ' + str(experts) + 'x' + str(tokens // experts):<28}"
              f"{'ms':>9}{'TFLOP/s':>9}{'x bf16':>8}{'% peak':>8}  path")
        try:
            ms_bf16 = rig.bench(lambda a=a, b=b: F.grouped_mm(a, b, offs=offs))
        except Exception as e:  # without torch's time the rows have no ratio: say why and go on
            print(f"{'bf16 F.grouped_mm':<28}  failed: {str(e).splitlines()[0][:80]}")
            continue
        row(rig, "bf16 F.grouped_mm", lambda a=a, b=b: F.grouped_mm(a, b, offs=offs), flops, ms_bf16, peak)
        # autoprec's bf16 product (into fp32 too: Triton's one-launch kernels, the wgrad's reading its operands in
        # place), then the quantized ones
        for fmt, out in (("bf16", torch.bfloat16), ("bf16", torch.float32), ("nvfp4", torch.bfloat16),
                         ("mxfp8", torch.bfloat16)):
            route = grouped_route(a.device, layout, fmt, (a.dtype, b.dtype), (a.shape, b.shape), len(offs), False,
                                  out)
            note = f"{route.kind} {route.path or ''}".strip() + (f" ({route.why})" if route.why else "")
            run = lambda a=a, b=b, f=fmt, o=out: grouped_mm(a, b, offs, f, out_dtype=o)  # noqa: E731
            per_group = mock.patch.object(grouped_dispatch, "grouped_gemm_path", lambda *_: ("per_group", "forced"))
            bf16_name = "bf16, autoprec" + (" -> fp32" if out == torch.float32 else "")
            cases = [(bf16_name, contextlib.nullcontext(), note)] if fmt == "bf16" else [
                (f"{fmt} + quantize", contextlib.nullcontext(), note),
                (f"{fmt} + quantize, per group", per_group, "per_group (forced)")]
            for name, ctx, note in cases:
                try:
                    with ctx:
                        row(rig, name, run, flops, ms_bf16, peak, f"  {note}")
                except Exception as e:  # a path that fails here should not hide the other rows
                    print(f"{name:<28}  failed: {str(e).splitlines()[0][:80]}")


def batched(rig: Rig, peak: float) -> None:
    """A planned bmm (attention scores over 64 batch x heads, head dim 128) against torch's bf16 bmm: the block-scaled
    product of quantized operands, alone and with their quantization, naming the grouped GEMM's path."""
    from autoprec.kernels import quantize, scaled_mm
    from autoprec.kernels.core.operand import Operand
    from autoprec.kernels.dispatch import grouped as grouped_dispatch

    batch, m, n, k = rig.bmm
    q = torch.randn(batch, m, k, device=rig.device, dtype=torch.bfloat16)
    kt = torch.randn(batch, k, n, device=rig.device, dtype=torch.bfloat16)
    flops = 2 * batch * m * n * k
    ms_bf16 = rig.bench(lambda: torch.bmm(q, kt))
    print(f"\n{f'bmm {batch}x{m}x{n}x{k}':<28}{'ms':>9}{'TFLOP/s':>9}{'x torch':>8}{'% peak':>8}  path")
    row(rig, "torch bf16 bmm", lambda: torch.bmm(q, kt), flops, ms_bf16, peak)
    for fmt in ("nvfp4", "mxfp8"):
        a, b = quantize(q, fmt, 2), quantize(kt, fmt, 1)
        path, why = grouped_dispatch.grouped_gemm_path(rig.capability(), "2d3d",
                                                       Operand(a.fmt, None, None, None, m, k),
                                                       Operand(b.fmt, None, None, None, n, k), torch.bfloat16, batch)
        note = f"  {path}" + (f" ({why})" if why else "")
        row(rig, f"autoprec {fmt}", lambda: scaled_mm(a, b, out_dtype=torch.bfloat16), flops, ms_bf16, peak, note)
        row(rig, "  + quantize q, k", lambda: scaled_mm(quantize(q, fmt, 2), quantize(kt, fmt, 1),
                                                    out_dtype=torch.bfloat16), flops, ms_bf16, peak)


def grouped_quantize(rig: Rig, hbm_tbs: float) -> None:
    """An experts fprop's operands quantized by the grouped quantizers (every group in one pass, offsets read on
    the device) against one quantization per group, in GB/s against HBM peak; expert weights (E, K, N) as they lie,
    blocked down their strided K (MXFP8 and NVFP4's 1x16 blocks: the slice kernels; NVFP4's 16x16: tiles)."""
    from autoprec.kernels.core.random_bits import group_seed, sr_stream
    from autoprec.kernels.dispatch.dense import quantize
    from autoprec.kernels.dispatch.grouped import quantize_batches, quantize_row_groups

    experts, tokens = rig.experts, rig.tokens
    x, w, offs = expert_operands(rig)
    bounds = [(g * (tokens // experts), (g + 1) * (tokens // experts)) for g in range(experts)]
    step = torch.tensor(1, device=rig.device)
    print(f"\n{'grouped quantize, ' + str(experts) + ' experts':<28}{'ms':>9}{'GB/s':>9}{'% HBM':>8}")
    for fmt in ("nvfp4", "mxfp8"):
        tile2d = fmt == "nvfp4"
        cases = [
            (f"{fmt} tokens sr, grouped", x, lambda f=fmt: quantize_row_groups(x, f, offs, rounding="sr", seed=1,
                                                                                step=step)),
            (f"{fmt} tokens sr, per group", x, lambda f=fmt: [
                quantize(x[s:e], f, 1, rounding="sr", seed=sr_stream(group_seed(1, g), 1))
                for g, (s, e) in enumerate(bounds)]),
            (f"{fmt} weights, batched", w, lambda f=fmt: quantize_batches(w, f, tile2d=tile2d)),
            (f"{fmt} weights, per expert", w, lambda f=fmt: [quantize(w[e], f, 0, tile2d=tile2d)
                                                             for e in range(experts)]),
        ]
        if tile2d:  # NVFP4's 1x16 blocks too: the slice kernels (weights as they lie, K strided)
            cases.append(("nvfp4 weights 1x16, batched", w, lambda: quantize_batches(w, "nvfp4")))
        for name, src, fn in cases:
            out, ms = rig.output_and_ms(fn)
            written = sum(q.codes.nbytes + q.scales.nbytes for q in (out if isinstance(out, list) else [out]))
            gbs = (src.nbytes + written) / ms / 1e6
            print(f"{name:<28}{ms:>9.3f}{gbs:>9.0f}{100 * gbs / (hbm_tbs * 1e3):>7.0f}%")


def training_step(rig: Rig, layers: int, regional: bool, profile: bool = False, graphs: bool = False) -> None:
    """Seconds per forward+backward of a GPT in bf16 (inductor) and under autoprec's plans (inner inductor);
    ``regional``: each block and the head compiled on its own, else the whole model; ``profile``: each plan's step
    also profiled once; ``graphs``: the bf16 and nvfp4 steps again under ``mode="reduce-overhead"`` (CUDA graphs:
    one replay per graph instead of a launch per kernel)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import autoprec

    from gpt_model import TinyGPT, tokens

    d, heads, ctx, batch, vocab = rig.gpt
    idx, tgt = (t.to(rig.device) for t in tokens(batch=batch, ctx=ctx, vocab=vocab))
    how = "per block" if regional else "whole"
    print(f"\n{f'training step, GPT {layers}x{d}, {how}':<28}{'ms':>9}{'x bf16':>8}{'calls 1/2/3 s':>15}  FLOP shares")
    runs = [("bf16 (inductor)", None, None), ("autoprec nvfp4", "nvfp4", None), ("autoprec mxfp8", "mxfp8", None),
            ("autoprec auto", "auto", None)]
    if not rig.dry:  # (the interpreter's forced Triton has no FP8-block GEMM)
        runs += [("autoprec fp8_block", "fp8_block", None), ("autoprec auto, h100 menu", "auto_h100", None)]
    if graphs:
        runs += [("bf16 (CUDA graphs)", None, "reduce-overhead"), ("autoprec nvfp4 (CUDA graphs)", "nvfp4",
                                                                   "reduce-overhead")]
        if not rig.dry:
            runs += [("autoprec fp8_block (CUDA graphs)", "fp8_block", "reduce-overhead"),
                     ("autoprec auto, h100 (CUDA graphs)", "auto_h100", "reduce-overhead")]
    base = None
    for name, recipe, mode in runs:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = TinyGPT(vocab=vocab, d=d, layers=layers, heads=heads, ctx=ctx, sdpa=True).to(rig.device).bfloat16()
        if recipe is None:
            compile_args = {"mode": mode}
        else:  # torch.compile takes mode or options, not both: autoprec's options carry the mode
            hardware = {"recipe": "auto", "hardware": "h100", "cost": "at_scale"} if recipe == "auto_h100" else {}
            options = {"recipe": recipe, "inner": "inductor"} | hardware | ({"mode": mode} if mode else {})
            compile_args = {"backend": "autoprec", "options": options}
        if regional:
            for module in [*model.blocks, model.lm_head]:
                module.compile(**compile_args)
            compiled = model
        else:
            compiled = torch.compile(model, **compile_args)

        def step() -> None:
            torch.compiler.cudagraph_mark_step_begin()
            compiled(idx, tgt).backward()

        warmup = []  # each first call's seconds: compile (auto: and calibrate), then auto's plan compiled, then run
        for _ in range(3):
            began = time.perf_counter()
            step()
            rig.sync()
            warmup.append(time.perf_counter() - began)
        shares = autoprec.plan(model).flop_share() if recipe else {"bf16": 1.0}
        ms = rig.per_step_ms(step)
        base = base or ms
        share = " ".join(f"{fmt} {v:.0%}" for fmt, v in sorted(shares.items()))
        calls = "/".join(f"{t:.0f}" if t >= 10 else f"{t:.1f}" for t in warmup)
        print(f"{name:<28}{ms:>9.1f}{ms / base:>8.2f}{calls:>15}  {share}")
        if profile and recipe and not mode:
            profile_step(rig, step, name)


def profile_step(rig: Rig, step, name: str) -> None:
    """The GPU kernels and host ops of one step, by GPU time (torch.profiler), to see where a plan's time goes
    (a dry run's, by CPU time)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    on = "CPU" if rig.dry else "GPU"
    activities = [ProfilerActivity.CPU] + ([] if rig.dry else [ProfilerActivity.CUDA])
    with torch_profile(activities=activities) as prof:
        step()
        rig.sync()
    print(f"\n{name}: one step's top ops by {on} time")
    print(prof.key_averages().table(sort_by=f"{on.lower().replace('gpu', 'cuda')}_time_total", row_limit=25,
                                    max_name_column_width=60))


if __name__ == "__main__":
    began = time.perf_counter()
    main()
    print(f"\nkernels_gpu.py took {time.perf_counter() - began:.0f} s (the target: under 5 minutes on an H200)")
