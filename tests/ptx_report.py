"""Compile every GPU kernel for sm_90 and sm_100 (the grouped GEMMs for sm_80, sm_120 too) without a GPU and report, as
JSON on stdout, whether its PTX uses tensor-core MMA and what the cubin needs (registers, stack, shared memory): the
tensor-core GEMM (NVFP4 and MXFP8 operands), the fp32 GEMM, the decode and epilogue kernels of the decoded + cuBLAS
GEMM, Triton's GEMM over decoded operands (tiles loaded by pointers, and by tensor descriptors), the experts' one-launch
grouped GEMMs, and the quantizers (SR and RHT on; the one-read, grouped, batched and K-grouped ones at their autotuned
tiles; the slice kernels of column copies and K-grouped operands as a launch specializes them, beside the tile kernels
on the same launch; and the fprop row quantizers as a launch specializes them, with their SASS instruction counts). Run
in a process without TRITON_INTERPRET (the interpreter replaces Triton's compiler): ``python tests/ptx_report.py`` (one
compiling process per core; about 9 CPU-minutes without Triton's cache). ``--quick``, the default test run's report,
compiles each autotuned quantizer at its first tile alone, the one-read quantizers only as a launch specializes them,
the quantizers for sm_90 alone (but ``BLACKWELL_QUICK``) and the grouped GEMMs for sm_90 and sm_100 alone (``jobs``).
Quantizers compile with the hardware conversions where a launch on the target takes them (``HW``).
``ptx_compile.report`` compiles one kernel and reads its PTX and cubin."""
from __future__ import annotations

import functools
import json
import multiprocessing
import os
import sys

from ptx_compile import LAUNCH_ALIGNED, report

from autoprec.formats import get_format
from autoprec.kernels.triton import decoded_gemm_tma as tma
from autoprec.kernels.triton import grouped_mm as gg
from autoprec.kernels.triton import quantize_cols as qc
from autoprec.kernels.triton import quantize_dual as qd
from autoprec.kernels.triton import quantize_fp8_block as fq
from autoprec.kernels.triton import quantize_grouped as qg
from autoprec.kernels.triton import quantize_k_groups as kg
from autoprec.kernels.triton import quantize_rows as qt
from autoprec.kernels.triton import scaled_mm as fp32
from autoprec.kernels.triton import scaled_mm_decoded as dec
from autoprec.kernels.triton import scaled_mm_tc as tc
from autoprec.kernels.triton import transpose_tiles as tt
from autoprec.kernels.triton import wgrad_bf16 as wb

POINTERS = {"a_codes": "*u8", "a_scales": "*u8", "a_ts": "*fp32", "b_codes": "*u8", "b_scales": "*u8",
            "b_ts": "*fp32", "bias_ptr": "*fp32", "out_ptr": "*fp32", "flag_ptr": "*i32", "M": "i32", "N": "i32",
            "K": "i32"}
KINDS = {"nvfp4": 0, "mxfp8": 1, "mxfp8_e5m2": 1, "bf16": 2}


def operand_meta(fmt: str) -> dict:
    """The constexprs describing one operand's format (``kernel_args``'s meta)."""
    elem = get_format(fmt).elem
    return {"KIND": KINDS[fmt], "EBITS": elem.ebits, "MBITS": elem.mbits, "BIAS": elem.bias,
            "INF": fmt == "mxfp8_e5m2"}


def constexprs(fmt: str) -> dict:
    meta = operand_meta(fmt)
    out = {f"A_{k}": v for k, v in meta.items()} | {f"B_{k}": v for k, v in meta.items()}
    return out | {"B_TILE_ROWS": 1, "HAS_BIAS": True, "OUT_BF16": True, "BM": tc.BLOCK_M, "BN": tc.BLOCK_N,
                  "BK": tc.BLOCK_K, "GUARDED": False}


QUANT_POINTERS = {"x_ptr": "*fp32", "m_ptr": "*fp32", "rand_ptr": "*i32", "k1": "i32", "k2": "i32", "codes_ptr": "*u8",
                  "scales_ptr": "*u8"}
SIZES = {"R": "i32", "K": "i32", "s_r": "i32", "s_k": "i32", "r_r": "i32", "r_k": "i32"}
E4M3 = get_format("mxfp8").elem
QUANT_BLOCKS = {"BR": qt.BLOCK_R, "BK": qt.BLOCK_K, "RHT": True}


def tile_tag(config) -> str:
    """A tile config's part of a report entry's name: ``br{BR}_bk{BK}``."""
    return f"br{config.kwargs['BR']}_bk{config.kwargs['BK']}"


def tiles(configs: list, full: bool) -> list:
    """The autotuned configs to compile: all of them, or (the quick report) the first."""
    return list(configs) if full else list(configs[:1])


def gemm_kernels() -> list[tuple[str, object, dict, dict, dict]]:
    """The dense GEMMs: tensor-core (NVFP4, MXFP8), Triton's over decoded operands (pointer loads, and TMA loads
    through tensor descriptors), fp32, and the decoded + cuBLAS path's decode and epilogue kernels."""
    gemm_opts = {"num_warps": tc.NUM_WARPS, "num_stages": tc.NUM_STAGES}
    out = [(f"tensor_core_gemm_{f}", fp32.scaled_mm_kernel, POINTERS, constexprs(f) | {"DOT": fp32.DOT_BF16},
            gemm_opts) for f in ("nvfp4", "mxfp8")]
    bm, bn, bk = dec.GEMM_BLOCKS  # Triton's GEMM over operands decoded to bf16 (NVFP4's: with their tensor scales)
    values = POINTERS | {"a_codes": "*bf16", "a_scales": "*bf16", "b_codes": "*bf16", "b_scales": "*bf16"}
    for f, kind in (("nvfp4", 3), ("mxfp8", 2)):
        const = constexprs("nvfp4") | {"A_KIND": kind, "B_KIND": kind, "BM": bm, "BN": bn, "BK": bk,
                                       "DOT": fp32.DOT_BF16}  # the element constexprs are unused for values
        out.append((f"decoded_triton_gemm_{f}", fp32.scaled_mm_kernel, values, const,  # as a launch specializes it
                    {"num_warps": dec.GEMM_WARPS, "num_stages": dec.GEMM_STAGES, LAUNCH_ALIGNED: True}))
    bm, bn, bk = tma.TMA_BLOCKS  # the same GEMM with its tiles read through tensor descriptors
    descriptors = {"a_desc": f"tensordesc<bf16[{bm},{bk}]>", "b_desc": f"tensordesc<bf16[{bn},{bk}]>",
                   "a_ts": "*fp32", "b_ts": "*fp32", "bias_ptr": "*fp32", "out_ptr": "*i16", "M": "i32", "N": "i32",
                   "K": "i32"}
    for f, kind in (("nvfp4", 3), ("mxfp8", 2)):
        const = {"A_KIND": kind, "B_KIND": kind, "HAS_BIAS": True, "OUT_BF16": True, "BM": bm, "BN": bn, "BK": bk,
                 "DOT": fp32.DOT_BF16}
        out.append((f"decoded_tma_gemm_{f}", tma.tma_gemm_kernel, descriptors, const,
                    {"num_warps": tma.TMA_WARPS, "num_stages": tma.TMA_STAGES}))
    fp32_const = constexprs("nvfp4") | {"BM": fp32.BLOCK_M, "BN": fp32.BLOCK_N, "BK": fp32.BLOCK_K,
                                        "DOT": fp32.DOT_FP32, "GUARDED": True}
    out.append(("fp32_gemm_nvfp4", fp32.scaled_mm_kernel, POINTERS, fp32_const, {}))
    sig = {"a_codes": "*u8", "a_scales": "*u8", "a_out": "*bf16", "b_codes": "*u8", "b_scales": "*u8", "b_out": "*bf16",
           "flag_ptr": "*i32", "RA": "i32", "RB": "i32", "K": "i32", "TILES_A": "i32"}
    decode = {}
    for f in ("nvfp4", "mxfp8"):  # the decoded + cuBLAS path's decode (both operands in one launch), and its epilogue
        meta = operand_meta(f)
        one = {k: v for k, v in meta.items() if k != "INF"} | {"HAS_INF": meta["INF"], "TILE_ROWS": 1,
                                                                "CHECK": f == "mxfp8"}
        decode[f] = {f"{side}_{k}": v for side in "AB" for k, v in one.items()} | {
            "BR": dec.DECODE_R, "BK": dec.DECODE_K, "IN_FP32": False}
        out.append((f"decode_{f}", dec._decode_kernel, sig, decode[f], {}))
    # MXFP8's decode as a launch specializes it, by the hardware's fp8 conversion, and in integer arithmetic
    out.append(("decode_mxfp8_launch", dec._decode_kernel, sig, decode["mxfp8"], {LAUNCH_ALIGNED: True}))
    out.append(("decode_mxfp8_launch_integer", dec._decode_kernel, sig, decode["mxfp8"] | {"HW": False},
                {LAUNCH_ALIGNED: True}))
    # operands of two formats (hybrid MXFP8's dgrad: E5M2 gradients, E4M3 weights) take a branch each
    hybrid = decode["mxfp8"] | {"A_EBITS": 5, "A_MBITS": 2, "A_BIAS": 15, "A_HAS_INF": True}
    out.append(("decode_mxfp8_hybrid_launch", dec._decode_kernel, sig, hybrid, {LAUNCH_ALIGNED: True}))
    epilogue = {"acc_ptr": "*fp32", "a_ts": "*fp32", "b_ts": "*fp32", "bias_ptr": "*fp32", "out_ptr": "*i16",
                "M": "i32", "N": "i32"}
    out.append(("epilogue", dec._epilogue_kernel, epilogue, {"A_KIND": 0, "B_KIND": 0, "HAS_BIAS": True,
                                                              "OUT_BF16": True, "BM": dec.EPILOGUE_M,
                                                              "BN": dec.EPILOGUE_N}, {}))
    return out


def quantizers(full: bool) -> list[tuple[str, object, dict, dict, dict]]:
    """Every quantizer (SR and RHT on), and the row quantizers as a launch specializes them."""
    nvfp4 = QUANT_POINTERS | {"amax_ptr": "*i32", "ts_ptr": "*fp32"} | SIZES
    mx = {"EBITS": E4M3.ebits, "MBITS": E4M3.mbits, "BIAS": E4M3.bias, "EMAX": E4M3.emax, "MAX": E4M3.max,
          "FLOOR": False, "SR": True}
    out = []
    for suffix, hashed in (("", False), ("_hashed", True)):  # SR bits loaded, or hashed in the kernel
        out.append((f"quantize_nvfp4{suffix}", qt._nvfp4_kernel.fn, nvfp4,
                    QUANT_BLOCKS | {"SR": True, "HASH": hashed, "TILE2D": False}, {}))
        out.append((f"quantize_mxfp8{suffix}", qt._mxfp8_kernel.fn, QUANT_POINTERS | SIZES,
                    QUANT_BLOCKS | mx | {"HASH": hashed}, {}))
    for cfg in qt.CONFIGS[1:] if full else []:  # the other autotuned tiles (hashed SR, RHT)
        tile, opts = {"BR": cfg.kwargs["BR"], "BK": cfg.kwargs["BK"]}, {"num_warps": cfg.num_warps}
        tag = tile_tag(cfg)
        out.append((f"quantize_nvfp4_hashed_{tag}", qt._nvfp4_kernel.fn, nvfp4,
                    QUANT_BLOCKS | tile | {"SR": True, "HASH": True, "TILE2D": False}, opts))
        out.append((f"quantize_mxfp8_hashed_{tag}", qt._mxfp8_kernel.fn, QUANT_POINTERS | SIZES,
                    QUANT_BLOCKS | mx | tile | {"HASH": True}, opts))
    amax = {"x_ptr": "*fp32", "m_ptr": "*fp32", "amax_ptr": "*i32", "R": "i32", "K": "i32", "s_r": "i32",
            "s_k": "i32", "s_b": "i32"}
    out.append(("quantize_amax", qt._amax_kernel, amax, QUANT_BLOCKS | qt.AMAX_TILE, {}))
    # the fprop case as a launch compiles it: rows of a row-major bf16 tensor (unit stride, a constant 1 in
    # Triton's specialization), aligned pointers, round-to-nearest
    rows = {"BR": qt.BLOCK_R, "BK": qt.BLOCK_K, "RHT": False, "SR": False, "HASH": False, "s_k": 1, "r_k": 1}
    bf16 = {"x_ptr": "*bf16"}
    out.append(("quantize_nvfp4_rows_launch", qt._nvfp4_kernel.fn, nvfp4 | bf16, rows | {"TILE2D": False},
                {LAUNCH_ALIGNED: True}))
    out.append(("quantize_mxfp8_rows_launch", qt._mxfp8_kernel.fn, QUANT_POINTERS | SIZES | bf16, mx | rows,
                {LAUNCH_ALIGNED: True}))
    wide = rows | {"BR": 64, "BK": 64}  # a tile of 32 elements per thread (4 warps)
    out.append(("quantize_nvfp4_rows_launch_br64_bk64", qt._nvfp4_kernel.fn, nvfp4 | bf16, wide | {"TILE2D": False},
                {LAUNCH_ALIGNED: True}))
    out.append(("quantize_nvfp4_rows_launch_br64_bk64_integer", qt._nvfp4_kernel.fn, nvfp4 | bf16,
                wide | {"TILE2D": False, "HW": False}, {LAUNCH_ALIGNED: True}))  # RNE in integer arithmetic
    out.append(("quantize_mxfp8_rows_launch_br64_bk64", qt._mxfp8_kernel.fn, QUANT_POINTERS | SIZES | bf16,
                mx | wide, {LAUNCH_ALIGNED: True}))
    out.append(("quantize_mxfp8_rows_launch_br64_bk64_integer", qt._mxfp8_kernel.fn, QUANT_POINTERS | SIZES | bf16,
                mx | wide | {"HW": False}, {LAUNCH_ALIGNED: True}))  # RNE in integer arithmetic, as interpreted
    fp8_block = {"x_ptr": "*bf16", "stride_r": "i32", "stride_k": "i32", "codes_ptr": "*u8", "scales_ptr": "*fp32",
                 "n_rows": "i32", "k_blocks": "i32"}
    out.append(("quantize_fp8_block_rows_launch", fq._fp8_block_kernel, fp8_block,
                {"BR": fq.ROWS, "TILE": False, "stride_k": 1}, {LAUNCH_ALIGNED: True}))
    out.append(("quantize_fp8_block_tiles_launch", fq._fp8_block_kernel, fp8_block,
                {"BR": fq.BLOCK, "TILE": True, "stride_k": 1}, {LAUNCH_ALIGNED: True, "num_warps": fq.TILE_WARPS}))
    return (out + column_kernels(mx, full) + dual_kernels(mx, full) + grouped_kernels(mx, full)
            + k_group_kernels(mx, full))


def column_kernels(mx: dict, full: bool) -> list[tuple[str, object, dict, dict, dict]]:
    """Column copies (blocks down the strided dim of a row-major bf16 tensor: unit stride along R) as a launch
    specializes them, the wgrad operands': NVFP4 with SR (the step read on the device) and RHT, MXFP8 with SR; the
    slice kernels at each autotuned tile, their RHT amax pass, and the tile kernels on the same launch (the
    comparison the tests draw)."""
    step = {"rand_ptr": "*i64", "x_ptr": "*bf16"}
    nvfp4 = QUANT_POINTERS | {"amax_ptr": "*i32", "ts_ptr": "*fp32"} | SIZES | step
    launch = {"s_r": 1, "SR": True, "HASH": 2}
    nv_flags, mx_flags = launch | {"RHT": True}, mx | launch | {"RHT": False}
    out = [("tile_cols_quantize_nvfp4_launch", qt._nvfp4_kernel.fn, nvfp4,
            nv_flags | {"BR": qt.BLOCK_R, "BK": qt.BLOCK_K, "TILE2D": False}, {LAUNCH_ALIGNED: True}),
           ("tile_cols_quantize_mxfp8_launch", qt._mxfp8_kernel.fn, QUANT_POINTERS | SIZES | step,
            mx_flags | {"BR": 32, "BK": 64}, {"num_warps": 8, LAUNCH_ALIGNED: True})]
    for fmt, kernel, sig, flags, configs in (
            ("nvfp4", qc._nvfp4_cols_kernel, nvfp4, nv_flags, qc.NVFP4_CONFIGS),
            ("mxfp8", qc._mxfp8_cols_kernel, QUANT_POINTERS | SIZES | step, mx_flags, qc.MXFP8_CONFIGS)):
        for cfg in tiles(configs, full):
            out.append((f"cols_quantize_{fmt}_{tile_tag(cfg)}", kernel.fn, sig,
                        flags | cfg.kwargs, {"num_warps": cfg.num_warps, LAUNCH_ALIGNED: True}))
    rne = {"s_r": 1, "SR": False, "HASH": 0, "RHT": False}  # a weight's column copy (dgrad's): round to nearest
    for fmt, kernel, sig, flags, cfg in (
            ("nvfp4", qc._nvfp4_cols_kernel, nvfp4, rne, qc.NVFP4_CONFIGS[0]),
            ("mxfp8", qc._mxfp8_cols_kernel, QUANT_POINTERS | SIZES | step, mx | rne, qc.MXFP8_CONFIGS[0])):
        out.append((f"cols_quantize_{fmt}_rne_launch", kernel.fn, sig, flags | cfg.kwargs,
                    {"num_warps": cfg.num_warps, LAUNCH_ALIGNED: True}))
    amax = {"x_ptr": "*bf16", "m_ptr": "*fp32", "amax_ptr": "*i32", "R": "i32", "K": "i32", "s_r": "i32",
            "s_k": "i32", "s_b": "i32"}
    rht_amax = {"x_ptr": "*bf16", "m_ptr": "*fp32", "amax_ptr": "*i32", "plain_ptr": "*i32"} | {
        k: v for k, v in amax.items() if k not in ("x_ptr", "m_ptr", "amax_ptr")}
    for plain in (False, True):  # the RHT amax, and with a pair's plain amax from the same read
        out.append((f"cols_quantize_amax_rht{'_and_plain' if plain else ''}", qc._amax_rht_cols_kernel, rht_amax,
                    {"s_r": 1, "PLAIN": plain} | qc.RHT_AMAX_TILE, {LAUNCH_ALIGNED: True}))
    out.append(("tile_cols_quantize_amax_rht_launch", qt._amax_kernel, amax,
                {"s_r": 1, "RHT": True} | qt.AMAX_TILE, {LAUNCH_ALIGNED: True}))
    # a 16x16-tiled weight's fprop quantization transposed for its dgrad
    sig = {"codes_ptr": "*u8", "scales_ptr": "*u8", "out_codes_ptr": "*u8", "out_scales_ptr": "*u8", "R": "i32",
           "K": "i32"}
    out.append(("transpose_tiles_launch", tt._transpose_tiles_kernel, sig, {"BR": tt.BLOCK_R, "BK": tt.BLOCK_K},
                {LAUNCH_ALIGNED: True}))
    return out


def dual_kernels(mx: dict, full: bool) -> list[tuple[str, object, dict, dict, dict]]:
    """The one-read row + column quantizers as a launch specializes them, at every autotuned tile (the quick
    report: the first), and in the full report with SR and RHT on both copies too; beside them the rowwise kernel
    such a launch replaces."""
    head = {"x_ptr": "*fp32", "m_ptr": "*fp32", "R": "i32", "K": "i32", "s_r": "i32", "s_k": "i32"}

    def side(s: str, nvfp4: bool) -> dict:
        ts = {f"amax_{s}": "*i32", f"ts_{s}": "*fp32"} if nvfp4 else {}
        return ({f"k1_{s}": "i32", f"k2_{s}": "i32", f"step_{s}": "*i64", f"codes_{s}": "*u8", f"scales_{s}": "*u8"}
                | ts | {f"i{s}_r": "i32", f"i{s}_k": "i32"})

    flags = {"RHT_A": True, "SR_A": True, "HASH_A": 1, "RHT_B": True, "SR_B": True, "HASH_B": 1}
    amax = {"x_ptr": "*fp32", "m_ptr": "*fp32", "amax_ptr": "*i32", "R": "i32", "K": "i32", "s_r": "i32",
            "s_k": "i32"}
    mx = {k: v for k, v in mx.items() if k != "SR"}
    # as the graph's launch on a row-major bf16 gradient specializes the kernel: SR both ways, the steps read on the
    # device (RHT on NVFP4's columnwise copy)
    gradient = {"s_k": 1, "ia_k": 1, "ib_r": 1, "RHT_A": False, "SR_A": True, "HASH_A": 2, "SR_B": True, "HASH_B": 2}
    out = []
    for fmt, kernel, sig, extra, configs in (
            ("nvfp4", qd._nvfp4_dual_kernel, head | side("a", True) | side("b", True), {}, qd.NVFP4_CONFIGS),
            ("mxfp8", qd._mxfp8_dual_kernel, head | side("a", False) | side("b", False), mx, qd.MXFP8_CONFIGS)):
        for cfg in tiles(configs, full):
            tile, opts = {"BR": cfg.kwargs["BR"], "BK": cfg.kwargs["BK"]}, {"num_warps": cfg.num_warps}
            tag = tile_tag(cfg)
            out.append((f"dual_launch_{fmt}_{tag}", kernel.fn, sig | {"x_ptr": "*bf16"},
                        extra | tile | gradient | {"RHT_B": fmt == "nvfp4"}, opts | {LAUNCH_ALIGNED: True}))
            if full:  # the launch above compiles the same kernel; this, each flag on (RHT on the rowwise copy too)
                out.append((f"quantize_dual_{fmt}_{tag}", kernel.fn, sig, extra | tile | flags, opts))
            if fmt == "nvfp4":
                out.append((f"quantize_dual_amax_{tag}", qd._amax2_kernel.fn, amax, tile | {"RHT_A": True,
                                                                                           "RHT_B": True}, opts))
    # the rowwise kernel the one-read kernel's launch replaces, beside the column slice kernel (column_kernels)
    rows = QUANT_POINTERS | SIZES | {"x_ptr": "*bf16", "rand_ptr": "*i64"}
    rows_sr = {"BR": qt.BLOCK_R, "BK": qt.BLOCK_K, "RHT": False, "SR": True, "HASH": 2, "s_k": 1, "r_k": 1}
    return out + [("rows_sr_launch_nvfp4", qt._nvfp4_kernel.fn, rows | {"amax_ptr": "*i32", "ts_ptr": "*fp32"},
                   rows_sr | {"TILE2D": False}, {LAUNCH_ALIGNED: True}),
                  ("rows_sr_launch_mxfp8", qt._mxfp8_kernel.fn, rows, mx | rows_sr, {LAUNCH_ALIGNED: True})]


def grouped_kernels(mx: dict, full: bool) -> list[tuple[str, object, dict, dict, dict]]:
    """The grouped token quantizers (bf16 tokens, SR) at their autotuned tiles with up to 64 groups, at the first
    with up to 256, the expert weight quantizers at their tiles, both amax passes, and for weights as they lie
    (K strided) the slice kernels at their tiles beside the tile kernels, as a launch specializes them."""
    head = {"x_ptr": "*bf16", "m_ptr": "*fp32", "offs_ptr": "*i32", "step_ptr": "*i64", "k1": "i32",
            "codes_ptr": "*u8", "scales_ptr": "*u8"}
    sizes = {"R": "i32", "K": "i32", "KL": "i32", "s_r": "i32", "s_k": "i32", "E": "i32"}
    nvfp4 = head | {"amax_ptr": "*i32", "ts_ptr": "*fp32"} | sizes
    out = []
    for cfg, groups in [(c, 64) for c in tiles(qg.NVFP4_CONFIGS, full)] + [(qg.NVFP4_CONFIGS[0], 256)]:
        tile = {"BR": cfg.kwargs["BR"], "BK": cfg.kwargs["BK"], "EP": groups, "RHT": False, "SR": True}
        tag, opts = f"{tile_tag(cfg)}_e{groups}", {"num_warps": cfg.num_warps}
        out.append((f"grouped_quantize_nvfp4_{tag}", qg._nvfp4_grouped_kernel.fn, nvfp4, tile, opts))
        out.append((f"grouped_quantize_mxfp8_{tag}", qg._mxfp8_grouped_kernel.fn, head | sizes, tile | mx, opts))
    amax = {"x_ptr": "*bf16", "m_ptr": "*fp32", "offs_ptr": "*i32", "amax_ptr": "*i32", "R": "i32", "K": "i32",
            "s_r": "i32", "s_k": "i32", "E": "i32"}
    out.append(("grouped_quantize_amax", qg._group_amax_kernel, amax,
                {"EP": 64, "RHT": False} | qt.AMAX_TILE, {}))
    batch = {"x_ptr": "*bf16", "m_ptr": "*fp32", "step_ptr": "*i64", "k1": "i32", "codes_ptr": "*u8",
             "scales_ptr": "*u8"}
    strides = {"R": "i32", "K": "i32", "KL": "i32", "s_r": "i32", "s_k": "i32", "s_b": "i32", "r_r": "i32",
               "r_k": "i32", "c_b": "i32", "sc_b": "i32"}
    for cfg in tiles(qg.NVFP4_CONFIGS, full):  # expert weights (SR, 16x16 tiles for NVFP4), read down their strided K
        tile = {"BR": cfg.kwargs["BR"], "BK": cfg.kwargs["BK"], "RHT": False, "SR": True}
        tag, opts = tile_tag(cfg), {"num_warps": cfg.num_warps}
        out.append((f"batch_quantize_nvfp4_{tag}", qg._nvfp4_batch_kernel.fn,
                    batch | {"amax_ptr": "*i32", "ts_ptr": "*fp32"} | strides, tile | {"TILE2D": True}, opts))
        out.append((f"batch_quantize_mxfp8_{tag}", qg._mxfp8_batch_kernel.fn, batch | strides, tile | mx, opts))
    launch = {"s_r": 1, "RHT": False, "SR": True}  # expert weights (E, K, N) as they lie, as a launch specializes them
    nv_sig = batch | {"amax_ptr": "*i32", "ts_ptr": "*fp32"} | strides
    out.append(("tile_batch_quantize_nvfp4_launch", qg._nvfp4_batch_kernel.fn, nv_sig,
                launch | {"BR": qt.BLOCK_R, "BK": qt.BLOCK_K, "TILE2D": False}, {LAUNCH_ALIGNED: True}))
    out.append(("tile_batch_quantize_mxfp8_launch", qg._mxfp8_batch_kernel.fn, batch | strides,
                launch | mx | {"BR": qt.BLOCK_R, "BK": qt.BLOCK_K}, {LAUNCH_ALIGNED: True}))
    for fmt, kernel, sig, configs, extra in (
            ("nvfp4", qg._nvfp4_batch_cols_kernel, nv_sig, qc.NVFP4_CONFIGS, {}),
            ("mxfp8", qg._mxfp8_batch_cols_kernel, batch | strides, qc.MXFP8_CONFIGS, mx)):
        for cfg in tiles(configs, full):
            out.append((f"batch_cols_quantize_{fmt}_{tile_tag(cfg)}", kernel.fn, sig,
                        launch | extra | cfg.kwargs, {"num_warps": cfg.num_warps, LAUNCH_ALIGNED: True}))
    return out


def k_group_kernels(mx: dict, full: bool) -> list[tuple[str, object, dict, dict, dict]]:
    """The wgrad operands' K-grouped quantizers (bf16, SR, RHT, 64 groups) at their autotuned tiles, and their amax;
    the slice kernels (tokens down a strided dim) compiled as launched."""
    head = {"x_ptr": "*bf16", "m_ptr": "*fp32", "offs_ptr": "*i32", "pad_ends_ptr": "*i32", "step_ptr": "*i64",
            "k1": "i32", "codes_ptr": "*u8", "scales_ptr": "*u8"}
    sizes = {"R": "i32", "KP": "i32", "T": "i32", "s_r": "i32", "s_k": "i32", "r_r": "i32", "r_k": "i32", "E": "i32"}
    out = []
    for fmt, kernel, sig, configs, extra in (
            ("nvfp4", kg._nvfp4_k_groups_kernel, head | {"amax_ptr": "*i32", "ts_ptr": "*fp32"} | sizes,
             kg.NVFP4_CONFIGS, {}),
            ("mxfp8", kg._mxfp8_k_groups_kernel, head | sizes, kg.MXFP8_CONFIGS, mx)):
        for cfg in tiles(configs, full):
            tile = {"BR": cfg.kwargs["BR"], "BK": cfg.kwargs["BK"], "EP": 64, "RHT": True, "SR": True,
                    "GROUP_ROWS": True}
            out.append((f"k_groups_quantize_{fmt}_{tile_tag(cfg)}", kernel.fn, sig, tile | extra,
                        {"num_warps": cfg.num_warps}))
    amax = {"x_ptr": "*bf16", "m_ptr": "*fp32", "offs_ptr": "*i32", "pad_ends_ptr": "*i32", "amax_ptr": "*i32",
            "R": "i32", "T": "i32", "s_r": "i32", "s_k": "i32", "E": "i32"}
    out.append(("k_groups_quantize_amax", kg._k_groups_amax_kernel, amax,
                {"EP": 64, "RHT": True} | qt.AMAX_TILE, {}))
    launch = {"s_r": 1, "EP": 64, "RHT": True, "SR": True, "GROUP_ROWS": False}  # tokens down a strided dim
    for fmt, kernel, configs in (("nvfp4", kg._nvfp4_k_groups_cols_kernel, qc.NVFP4_CONFIGS),
                                 ("mxfp8", kg._mxfp8_k_groups_cols_kernel, qc.MXFP8_CONFIGS)):
        sig = head | ({"amax_ptr": "*i32", "ts_ptr": "*fp32"} if fmt == "nvfp4" else {}) | sizes
        for cfg in tiles(configs, full):
            out.append((f"k_groups_cols_quantize_{fmt}_{tile_tag(cfg)}", kernel.fn, sig,
                        launch | cfg.kwargs | ({} if fmt == "nvfp4" else mx), {"num_warps": cfg.num_warps,
                                                                              LAUNCH_ALIGNED: True}))
    out.append(("k_groups_cols_quantize_amax_rht", kg._k_groups_amax_rht_cols_kernel, amax,
                {"s_r": 1, "EP": 64} | qc.RHT_AMAX_TILE, {LAUNCH_ALIGNED: True}))
    return out


def grouped_gemms() -> list[tuple[str, object, dict, dict, dict]]:
    """The experts' one-launch GEMMs, 2d x 3d (up to 63 groups) and the wgrad's 2d x 2d, bf16 out: tiles decoded in
    registers (NVFP4, with 16x16 weight tiles for 2d x 3d; MXFP8), pre-decoded bf16 tiles with NVFP4's per-group
    tensor scales, and the guarded fp32 recompute; the unquantized wgrad reading its bf16 operands in place; and the
    2d x 3d kernel's equal groups (a batched product) as sm_90 runs them, pre-decoded bf16 tiles and the recompute."""
    sig = {k: v for k, v in POINTERS.items() if k not in ("bias_ptr", "M", "N", "K")} | {
        "offs_ptr": "*i32", "out_ptr": "*i16", "T": "i32", "N": "i32", "K": "i32", "E": "i32", "b_step": "i32",
        "bs_step": "i32"}
    sig = {name: sig[name] for name in gg.grouped_mm_kernel.arg_names if name in sig}

    def const(fmt: str, blocks: tuple[int, int, int], dot: int, tile_rows: int = 1, scaled: bool = False) -> dict:
        meta = ({"KIND": 2, "EBITS": 0, "MBITS": 0, "BIAS": 0, "INF": False} if fmt == "bf16"
                else operand_meta(fmt))  # kernel_args' meta of a bf16 operand
        meta = {f"{side}_{k}": v for k, v in meta.items() for side in "AB"} | {"B_TILE_ROWS": tile_rows}
        return meta | {"A_TS": scaled, "B_TS": scaled, "OUT_BF16": True, "EP": 64, "EQUAL": False, "BM": blocks[0],
                       "BN": blocks[1], "BK": blocks[2], "DOT": dot, "GUARDED": False}

    wgrad_sig = {k: v for k, v in sig.items() if k not in ("offs_ptr", "T", "b_step", "bs_step")} | {
        "ends_ptr": "*i32", "M": "i32", "KP": "i32"}
    wgrad_sig = {name: wgrad_sig[name] for name in gg.grouped_wgrad_kernel.arg_names if name in wgrad_sig}
    out = []
    wgrad_drop = ("B_TILE_ROWS", "EP", "EQUAL")
    for name, kernel, signature, drop in (("gemm", gg.grouped_mm_kernel, sig, ()),
                                          ("wgrad", gg.grouped_wgrad_kernel, wgrad_sig, wgrad_drop)):
        def spec(fmt, blocks, dot, **kw):
            return {k: v for k, v in const(fmt, blocks, dot, **kw).items() if k not in drop}

        bf16 = signature | {"a_codes": "*bf16", "b_codes": "*bf16"}
        out += [(f"tensor_core_grouped_{name}_nvfp4", kernel, signature,
                 spec("nvfp4", gg.TC_BLOCKS, fp32.DOT_BF16, tile_rows=16 if name == "gemm" else 1, scaled=True),
                 gg.TC_OPTIONS),
                (f"tensor_core_grouped_{name}_mxfp8", kernel, signature, spec("mxfp8", gg.TC_BLOCKS, fp32.DOT_BF16),
                 gg.TC_OPTIONS),
                (f"tensor_core_grouped_{name}_bf16", kernel, bf16, spec("bf16", gg.BF16_BLOCKS, fp32.DOT_BF16,
                                                                        scaled=True), gg.BF16_OPTIONS),
                (f"fp32_grouped_{name}_mxfp8", kernel, signature,
                 spec("mxfp8", gg.FP32_BLOCKS, fp32.DOT_FP32) | {"GUARDED": True}, {})]
    equal = {"EQUAL": True, "EP": 1}
    bf16 = sig | {"a_codes": "*bf16", "b_codes": "*bf16"}
    # the bf16 wgrad reading its operands in place, as a launch specializes the usual strides (unit along M and N)
    inplace_sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "offs_ptr": "*i32", "out_ptr": "*i16", "M": "i32", "N": "i32",
                   "T": "i32", "s_at": "i32", "s_bt": "i32"}
    inplace = {"s_am": 1, "s_bn": 1, "OUT_BF16": True, "BM": gg.BF16_BLOCKS[0], "BN": gg.BF16_BLOCKS[1],
               "BK": gg.BF16_BLOCKS[2], "DOT": fp32.DOT_BF16}
    return out + [("tensor_core_grouped_wgrad_inplace_bf16", wb.bf16_wgrad_kernel, inplace_sig, inplace,
                   gg.BF16_OPTIONS),
                  ("tensor_core_grouped_batched_bf16", gg.grouped_mm_kernel, bf16,
                   const("bf16", gg.BF16_BLOCKS, fp32.DOT_BF16, scaled=True) | equal, gg.BF16_OPTIONS),
                  ("fp32_grouped_batched_mxfp8", gg.grouped_mm_kernel, sig,
                   const("mxfp8", gg.FP32_BLOCKS, fp32.DOT_FP32) | {"GUARDED": True} | equal, {})]


# NVFP4 quantizers rounding to nearest, whose sm_100 launches convert to E2M1 in hardware, beside the integer path
BLACKWELL_QUICK = ("quantize_nvfp4_rows_launch_br64_bk64", "quantize_nvfp4_rows_launch_br64_bk64_integer",
                   "cols_quantize_nvfp4_rne_launch")


def jobs(full: bool = True) -> list[tuple[tuple, int]]:
    """(kernel, target) pairs: every GEMM for sm_90 and sm_100, the grouped GEMMs for sm_80 (A100: its bf16 experts
    run them) and sm_120 (RTX 50x0 / PRO 6000, GB10: torch has no block-scaled grouped GEMM there) too, and the
    quantizers for sm_90 and sm_100. The quick report (not ``full``) compiles each quantizer at its first tile, for
    sm_90 alone: the quantizers use no tensor cores, and sm_100 builds them from the same Triton IR (for a third of
    the quick report's compile time), but for ``BLACKWELL_QUICK``, whose code sm_100 changes (its E2M1
    conversion); and the grouped GEMMs for sm_90 and sm_100 alone (sm_80 and sm_120 take another 40
    CPU-seconds)."""
    quant = quantizers(full)
    return ([(k, cap) for k in gemm_kernels() for cap in (90, 100)] + [(k, 90) for k in quant]
            + [(k, 100) for k in quant if full or k[0] in BLACKWELL_QUICK]
            + [(k, cap) for k in grouped_gemms() for cap in ((80, 90, 100, 120) if full else (90, 100))])


def report_job(full: bool, index: int) -> dict:
    """``jobs(full)[index]``'s report; the quick report counts SASS instructions of the tiled (BR x BK) kernels
    alone, the ones the tests compare per element."""
    kernel, cap = jobs(full)[index]
    return report(*kernel, cap, sass=full or {"BR", "BK"} <= kernel[3].keys())


if __name__ == "__main__":  # compiles take minutes without Triton's cache: one process per core
    full = "--quick" not in sys.argv[1:]
    with multiprocessing.get_context("fork").Pool(os.cpu_count()) as pool:
        print(json.dumps(pool.map(functools.partial(report_job, full), range(len(jobs(full))), chunksize=1)))
