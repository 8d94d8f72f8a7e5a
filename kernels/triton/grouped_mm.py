"""Experts' block-scaled GEMMs in one Triton launch each, the group bounds read on the device; each group under its
own NVFP4 tensor scales, each group's product equal to the dense ``scaled_mm`` of that group up to fp32
accumulation order (tiles decoded by ``scaled_mm_triton``'s ``decode_tile`` and multiplied as its kernel does).

- 2d x 3d (fprop, dgrad; ``grouped_mm_kernel``): C[rows of group g] = A[rows of g] · B_gᵀ. A is the (T, K) token
  rows quantized group by group (``QuantizedGroups``), B every expert's (N, K) operand one after the other (E·N
  rows). Each group's rows are cut into row tiles of their own, the rows past the last offset into tiles written
  as zeros; a program finds its tile from the groups' tile counts, summed in the kernel from the cumulative ends
  (the grid, ``ceil(T / BM) + E + 1`` row tiles, covers any group sizes), so every tile runs one K loop for one
  expert, however small the groups. A batched product's E equal groups of T / E rows (``offs`` None) find their
  tiles by division instead, with no offsets to read or sum (a batch may have thousands of items).
- 2d x 2d (wgrad; ``grouped_wgrad_kernel``): C_g = A_g · B_gᵀ, reduced over group g's tokens. A (M, KP) and B
  (N, KP) are K-grouped (``quantize_k_groups_triton``: each group's padded columns between its padded ends); grid
  axis 2 is the group, whose K loop runs over its own columns; an empty group's product is zero.

Two ways to run each, as for the dense GEMM:
- ``*_tc_triton``: tiles decoded in registers, bf16 tensor-core dot (the interpreter's and
  ``AUTOPREC_KERNELS=triton``'s path; the fp32 dot where MXFP8 scales leave bf16's exact range).
- ``*_decoded`` (sm_90, and 2d x 3d products sm_100's native grouped GEMM does not take): both operands decoded to
  bf16 in memory first (``decode_pair``), then the kernel reads bf16 tiles for a plain bf16 dot; a device flag set
  by the decode (MXFP8 values bf16 does not hold) makes the fp32 kernel recompute the product in place.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import triton
import triton.language as tl

from autoprec.formats import BF16

from ..core.launch import cdiv, guarded_grid
from ..core.operand import KIND_NVFP4, Operand, kernel_args
from .scaled_mm import (
    DOT_FP32,
    accumulate,
    bf16_dot,
    decode_tile,
    dot_operand,
    from_row,
    store_tile,
)
from .scaled_mm_decoded import decode_pair, exactness_flag
from .scaled_mm_tc import exact_decode_problem

TC_BLOCKS, TC_OPTIONS = (64, 128, 32), {"num_warps": 8, "num_stages": 3}  # in-register decode (BM=128 spills)
BF16_BLOCKS, BF16_OPTIONS = (128, 128, 32), {"num_warps": 8, "num_stages": 3}  # pre-decoded bf16 (BK=64 spills)
FP32_BLOCKS = (32, 32, 32)  # BK=64 spills in the 2d x 3d kernel


@triton.jit
def operand_tile(codes_ptr, scales_ptr, rows, k0, R, K, BK: tl.constexpr, KIND: tl.constexpr, EBITS: tl.constexpr,
                 MBITS: tl.constexpr, BIAS: tl.constexpr, HAS_INF: tl.constexpr, TILE_ROWS: tl.constexpr,
                 DOT: tl.constexpr):
    """A [len(rows), BK] tile of one operand as the dot takes it (``decode_tile``, then ``dot_operand``); NVFP4
    tiles for a tensor-core dot decode per block, as the dense kernel's do."""
    return dot_operand(decode_tile(codes_ptr, scales_ptr, rows, k0, R, K, BK, KIND, EBITS, MBITS, BIAS, HAS_INF,
                                   TILE_ROWS, DOT != 0 and KIND == 0), DOT)


@triton.jit
def group_tensor_scales(acc, a_ts, b_ts, g, A_TS: tl.constexpr, B_TS: tl.constexpr):
    """Group g's NVFP4 decode scales (``a_ts[g]``, ``b_ts[g]`` where A_TS, B_TS), once on its fp32 accumulator."""
    if A_TS:
        acc = acc * tl.load(a_ts + g)
    if B_TS:
        acc = acc * tl.load(b_ts + g)
    return acc


@triton.jit
def _tile_group(offs_ptr, p, T, E, EP: tl.constexpr, BM: tl.constexpr, EQUAL: tl.constexpr):
    """(g, g's first row tile, g's first row, one past its last row) of row tile ``p``: the group whose tiles hold
    it (E: the rows past the last offset; past E: a tile past the last). EQUAL: E groups of T / E rows (a batched
    product), no offsets read; else the groups' tile counts summed from the cumulative ends at ``offs_ptr``."""
    if EQUAL:
        size = T // E
        per = (size + BM - 1) // BM
        g = p // per
        return g, g * per, g * size, g * size + size
    e = tl.arange(0, EP)  # groups 0 .. E-1, then the rows past the last offset as group E (EP > E)
    # bounds held to 0 .. T and sizes to >= 0: offsets out of range touch no row past the tensors
    ends = tl.minimum(tl.maximum(tl.load(offs_ptr + e, mask=e < E, other=T), 0), T)
    starts = tl.where(e == 0, 0, tl.minimum(tl.maximum(tl.load(offs_ptr + e - 1, mask=(e > 0) & (e <= E), other=T),
                                                       0), T))
    tiles = tl.maximum(ends - starts + BM - 1, 0) // BM
    last_tile = tl.cumsum(tiles, 0)  # one past each group's last tile
    g = tl.sum((last_tile <= p).to(tl.int32))
    first = tl.sum(tl.where(e == g, last_tile - tiles, 0))
    return g, first, tl.sum(tl.where(e == g, starts, 0)), tl.sum(tl.where(e == g, ends, 0))


@triton.jit
def grouped_mm_kernel(
    a_codes, a_scales, a_ts, b_codes, b_scales, b_ts, offs_ptr, out_ptr, flag_ptr, T, N, K, E, b_step, bs_step,
    A_KIND: tl.constexpr, A_EBITS: tl.constexpr, A_MBITS: tl.constexpr, A_BIAS: tl.constexpr, A_INF: tl.constexpr,
    B_KIND: tl.constexpr, B_EBITS: tl.constexpr, B_MBITS: tl.constexpr, B_BIAS: tl.constexpr, B_INF: tl.constexpr,
    B_TILE_ROWS: tl.constexpr, A_TS: tl.constexpr, B_TS: tl.constexpr, OUT_BF16: tl.constexpr, EP: tl.constexpr,
    EQUAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT: tl.constexpr,
    GUARDED: tl.constexpr,
):
    """Output tile (program ids) of the grouped product: program p of axis 0 takes the p-th row tile of the groups'
    tiles, each group's rows cut into tiles of its own (``_tile_group``), plus the tiles of the rows past the last
    offset, which it writes as zeros; programs past the last tile do nothing. Expert g's B codes and scales start
    ``g·b_step`` and ``g·bs_step`` elements in, its tensor scales (A_TS, B_TS) are ``a_ts[g]``, ``b_ts[g]``.
    GUARDED: a persistent 1D grid, as ``scaled_mm_kernel``'s (its programs stride over the row tiles' and column
    tiles' pairs only where the int32 at ``flag_ptr`` is set)."""
    if GUARDED:
        if tl.load(flag_ptr) != 0:
            if EQUAL:
                row_tiles = E * tl.cdiv(T // E, BM)
            else:
                row_tiles = tl.cdiv(T, BM) + E + 1
            col_tiles = tl.cdiv(N, BN)
            for q in range(tl.program_id(0), row_tiles * col_tiles, tl.num_programs(0)):
                _grouped_tile(q // col_tiles, q % col_tiles, a_codes, a_scales, a_ts, b_codes, b_scales, b_ts,
                              offs_ptr, out_ptr, T, N, K, E, b_step, bs_step, A_KIND, A_EBITS, A_MBITS, A_BIAS, A_INF,
                              B_KIND, B_EBITS, B_MBITS, B_BIAS, B_INF, B_TILE_ROWS, A_TS, B_TS, OUT_BF16, EP, EQUAL,
                              BM, BN, BK, DOT)
    else:
        _grouped_tile(tl.program_id(0), tl.program_id(1), a_codes, a_scales, a_ts, b_codes, b_scales, b_ts, offs_ptr,
                      out_ptr, T, N, K, E, b_step, bs_step, A_KIND, A_EBITS, A_MBITS, A_BIAS, A_INF, B_KIND, B_EBITS,
                      B_MBITS, B_BIAS, B_INF, B_TILE_ROWS, A_TS, B_TS, OUT_BF16, EP, EQUAL, BM, BN, BK, DOT)


@triton.jit
def _grouped_tile(
    p, pid_n, a_codes, a_scales, a_ts, b_codes, b_scales, b_ts, offs_ptr, out_ptr, T, N, K, E, b_step, bs_step,
    A_KIND: tl.constexpr, A_EBITS: tl.constexpr, A_MBITS: tl.constexpr, A_BIAS: tl.constexpr, A_INF: tl.constexpr,
    B_KIND: tl.constexpr, B_EBITS: tl.constexpr, B_MBITS: tl.constexpr, B_BIAS: tl.constexpr, B_INF: tl.constexpr,
    B_TILE_ROWS: tl.constexpr, A_TS: tl.constexpr, B_TS: tl.constexpr, OUT_BF16: tl.constexpr, EP: tl.constexpr,
    EQUAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT: tl.constexpr,
):
    """Row tile ``p``, column tile ``pid_n`` of ``grouped_mm_kernel``'s product."""
    g, first, start, end = _tile_group(offs_ptr, p, T, E, EP, BM, EQUAL)
    if g <= E:
        top = start + (p - first) * BM  # the tile's first row; its rows indexed from there
        rm = tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), tl.float32)
        if g < E:
            ac, asc = from_row(a_codes, a_scales, top, K, A_KIND, 1)
            at = tl.cast(g, tl.int64)  # an expert's operand may start past 2**31 elements
            bc, bs = b_codes + at * b_step, b_scales + at * bs_step
            for k0 in range(0, K, BK):
                a = operand_tile(ac, asc, rm, k0, end - top, K, BK, A_KIND, A_EBITS, A_MBITS, A_BIAS, A_INF, 1, DOT)
                b = operand_tile(bc, bs, rn, k0, N, K, BK, B_KIND, B_EBITS, B_MBITS, B_BIAS, B_INF, B_TILE_ROWS,
                                 DOT)
                acc = accumulate(acc, a, b, DOT)
            acc = group_tensor_scales(acc, a_ts, b_ts, g, A_TS, B_TS)
        store_tile(acc, out_ptr, out_ptr + tl.cast(top, tl.int64) * N, rm, rn, end - top, N, False, OUT_BF16)


@triton.jit
def grouped_wgrad_kernel(
    a_codes, a_scales, a_ts, b_codes, b_scales, b_ts, ends_ptr, out_ptr, flag_ptr, M, N, KP, E,
    A_KIND: tl.constexpr, A_EBITS: tl.constexpr, A_MBITS: tl.constexpr, A_BIAS: tl.constexpr, A_INF: tl.constexpr,
    B_KIND: tl.constexpr, B_EBITS: tl.constexpr, B_MBITS: tl.constexpr, B_BIAS: tl.constexpr, B_INF: tl.constexpr,
    A_TS: tl.constexpr, B_TS: tl.constexpr, OUT_BF16: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    BK: tl.constexpr, DOT: tl.constexpr, GUARDED: tl.constexpr,
):
    """Output tile (program ids 0, 1) of group ``program_id(2)``'s (M, N) product, of E groups, reduced over the
    group's padded columns (``ends_ptr``: their cumulative ends; BK divides every group's width); GUARDED: a
    persistent 1D grid striding over the groups' tiles where the flag is set, as in ``grouped_mm_kernel``."""
    if GUARDED:
        if tl.load(flag_ptr) != 0:
            row_tiles, col_tiles = tl.cdiv(M, BM), tl.cdiv(N, BN)
            for q in range(tl.program_id(0), row_tiles * col_tiles * E, tl.num_programs(0)):
                _wgrad_tile(q // col_tiles % row_tiles, q % col_tiles, q // (row_tiles * col_tiles), a_codes,
                            a_scales, a_ts, b_codes, b_scales, b_ts, ends_ptr, out_ptr, M, N, KP, A_KIND, A_EBITS,
                            A_MBITS, A_BIAS, A_INF, B_KIND, B_EBITS, B_MBITS, B_BIAS, B_INF, A_TS, B_TS, OUT_BF16, BM,
                            BN, BK, DOT)
    else:
        _wgrad_tile(tl.program_id(0), tl.program_id(1), tl.program_id(2), a_codes, a_scales, a_ts, b_codes, b_scales,
                    b_ts, ends_ptr, out_ptr, M, N, KP, A_KIND, A_EBITS, A_MBITS, A_BIAS, A_INF, B_KIND, B_EBITS,
                    B_MBITS, B_BIAS, B_INF, A_TS, B_TS, OUT_BF16, BM, BN, BK, DOT)


@triton.jit
def _wgrad_tile(
    pid_m, pid_n, g, a_codes, a_scales, a_ts, b_codes, b_scales, b_ts, ends_ptr, out_ptr, M, N, KP,
    A_KIND: tl.constexpr, A_EBITS: tl.constexpr, A_MBITS: tl.constexpr, A_BIAS: tl.constexpr, A_INF: tl.constexpr,
    B_KIND: tl.constexpr, B_EBITS: tl.constexpr, B_MBITS: tl.constexpr, B_BIAS: tl.constexpr, B_INF: tl.constexpr,
    A_TS: tl.constexpr, B_TS: tl.constexpr, OUT_BF16: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    BK: tl.constexpr, DOT: tl.constexpr,
):
    """Tile (``pid_m``, ``pid_n``) of group ``g``'s product in ``grouped_wgrad_kernel``."""
    m0, n0 = pid_m * BM, pid_n * BN
    ac, asc = from_row(a_codes, a_scales, m0, KP, A_KIND, 1)  # (M, KP) passes 2**31 at half a million tokens
    bc, bsc = from_row(b_codes, b_scales, n0, KP, B_KIND, 1)
    local_m, local_n = tl.arange(0, BM), tl.arange(0, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    lo = tl.maximum(tl.load(ends_ptr + g - 1, mask=g > 0, other=0), 0)  # held to 0 .. KP, whatever the ends
    for k0 in range(lo, tl.minimum(tl.load(ends_ptr + g), KP), BK):
        a = operand_tile(ac, asc, local_m, k0, M - m0, KP, BK, A_KIND, A_EBITS, A_MBITS, A_BIAS, A_INF, 1, DOT)
        b = operand_tile(bc, bsc, local_n, k0, N - n0, KP, BK, B_KIND, B_EBITS, B_MBITS, B_BIAS, B_INF, 1, DOT)
        acc = accumulate(acc, a, b, DOT)
    acc = group_tensor_scales(acc, a_ts, b_ts, g, A_TS, B_TS)
    store_tile(acc, out_ptr, out_ptr + tl.cast(g, tl.int64) * M * N, m0 + local_m, n0 + local_n, M, N, False,
               OUT_BF16)


Launch = Callable[..., torch.Tensor]


def _args(a: Operand, b: Operand, a_ts: torch.Tensor | None, b_ts: torch.Tensor | None, out: torch.Tensor) -> list:
    """The kernels' leading operand arguments (codes, scales, tensor scales of a then b; ``out`` where unused)."""
    (a_codes, a_scales, _), _ = kernel_args(a)
    (b_codes, b_scales, _), _ = kernel_args(b)
    return [a_codes, a_scales, out if a_ts is None else a_ts, b_codes, b_scales, out if b_ts is None else b_ts]


def _options(a: Operand, b: Operand, a_ts, b_ts, out: torch.Tensor, dot: int, blocks: tuple[int, int, int],
             flag: torch.Tensor | None) -> dict:
    """The kernels' shared constexprs and launch options."""
    return dict(A_TS=a_ts is not None, B_TS=b_ts is not None, OUT_BF16=out.dtype == torch.bfloat16, BM=blocks[0],
                BN=blocks[1], BK=blocks[2], DOT=dot, GUARDED=flag is not None)


def store_view(out: torch.Tensor) -> torch.Tensor:
    """``out`` as the kernels store to it (bf16 as its int16 bits, which ``store_tile`` writes)."""
    return out.view(torch.int16) if out.dtype == torch.bfloat16 else out


def launch_grouped(a: Operand, b: Operand, a_ts: torch.Tensor | None, b_ts: torch.Tensor | None, out: torch.Tensor,
                   dot: int, blocks: tuple[int, int, int], *, experts: int, offs: torch.Tensor | None,
                   flag: torch.Tensor | None = None, **options) -> torch.Tensor:
    """Run the 2d x 3d kernel into ``out`` (T, N): ``a`` the (T, K) token rows, ``b`` the ``experts`` (N, K)
    operands stacked (E·N rows), ``a_ts`` / ``b_ts`` one tensor scale per group (None: none to apply), ``offs``
    the E cumulative ends (int32, on the device; None: E groups of T / E rows, a batched product); ``flag``: as
    ``triton.scaled_mm.launch`` takes it."""
    t, k, n = a.rows, a.k, b.rows // experts
    (b_codes, b_scales, _), b_meta = kernel_args(b)
    equal = offs is None
    # at most one partial tile per group and the tail; E whole runs of tiles for equal groups
    tiles = experts * cdiv(t // experts, blocks[0]) if equal else cdiv(t, blocks[0]) + experts + 1
    grouped_mm_kernel[guarded_grid((tiles, cdiv(n, blocks[1])), flag, out.device)](
        *_args(a, b, a_ts, b_ts, out), out if equal else offs, store_view(out), out if flag is None else flag, t, n, k,
        experts, b_codes.numel() // experts, b_scales.numel() // experts, *kernel_args(a)[1], *b_meta,
        b.tile_rows if b.kind == KIND_NVFP4 else 1, EP=1 if equal else triton.next_power_of_2(experts + 1),
        EQUAL=equal, **_options(a, b, a_ts, b_ts, out, dot, blocks, flag), **options,
    )
    return out


def launch_wgrad(a: Operand, b: Operand, a_ts: torch.Tensor | None, b_ts: torch.Tensor | None, out: torch.Tensor,
                 dot: int, blocks: tuple[int, int, int], *, ends: torch.Tensor, flag: torch.Tensor | None = None,
                 **options) -> torch.Tensor:
    """Run the 2d x 2d kernel into ``out`` (E, M, N): ``a`` (M, KP) and ``b`` (N, KP) K-grouped
    (``quantize_k_groups_triton``'s layout, ``ends`` its padded ends), tensor scales and ``flag`` as in
    ``launch_grouped``."""
    m, n, groups = a.rows, b.rows, ends.shape[0]
    grouped_wgrad_kernel[guarded_grid((cdiv(m, blocks[0]), cdiv(n, blocks[1]), groups), flag, out.device)](
        *_args(a, b, a_ts, b_ts, out), ends, store_view(out), out if flag is None else flag, m, n, a.k, groups,
        *kernel_args(a)[1], *kernel_args(b)[1], **_options(a, b, a_ts, b_ts, out, dot, blocks, flag), **options,
    )
    return out


def _tensor_scales(op: Operand) -> torch.Tensor | None:
    return op.tensor_scale if op.kind == KIND_NVFP4 else None


def _in_registers(launch: Launch, a: Operand, b: Operand, out: torch.Tensor) -> torch.Tensor:
    """The product with tiles decoded in registers: bf16 tensor-core dot, or the fp32 dot where MXFP8 scales leave
    bf16's exact range (checked on the host, as ``gemm_path`` checks the dense operands)."""
    scales = _tensor_scales(a), _tensor_scales(b)
    if exact_decode_problem(a) or exact_decode_problem(b):
        return launch(a, b, *scales, out, DOT_FP32, FP32_BLOCKS)
    return launch(a, b, *scales, out, bf16_dot(), TC_BLOCKS, **TC_OPTIONS)


def _decoded(launch: Launch, a: Operand, b: Operand, out: torch.Tensor) -> torch.Tensor:
    """The product with both operands decoded to bf16 in memory first, then read as bf16 tiles; nothing is read on
    the host (MXFP8 values bf16 does not hold are found on the device, and the fp32 kernel recomputes the product
    in place)."""
    flag = exactness_flag(a, b)
    decoded = [Operand(BF16, values, None, None, op.rows, op.k) for op, values in zip((a, b), decode_pair(a, b, flag))]
    scales = _tensor_scales(a), _tensor_scales(b)
    launch(*decoded, *scales, out, bf16_dot(), BF16_BLOCKS, **BF16_OPTIONS)
    if flag is not None:
        launch(a, b, *scales, out, DOT_FP32, FP32_BLOCKS, flag=flag)
    return out


def _experts_out(a: Operand, b: Operand, experts: int, out_dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(a.rows, b.rows // experts, device=a.codes.device, dtype=out_dtype)


def _wgrad_out(a: Operand, b: Operand, ends: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(ends.shape[0], a.rows, b.rows, device=a.codes.device, dtype=out_dtype)


def grouped_mm_tc_triton(a: Operand, b: Operand, experts: int, offs: torch.Tensor | None,
                         out_dtype: torch.dtype) -> torch.Tensor:
    """(T, N) 2d x 3d product of quantized ``a`` and ``b`` (``launch_grouped``'s layout and ``offs``, NVFP4 tensor
    scales one per group), tiles decoded in registers."""
    return _in_registers(partial(launch_grouped, experts=experts, offs=offs), a, b,
                         _experts_out(a, b, experts, out_dtype))


def grouped_mm_decoded(a: Operand, b: Operand, experts: int, offs: torch.Tensor | None,
                       out_dtype: torch.dtype) -> torch.Tensor:
    """``grouped_mm_tc_triton``'s product with the operands decoded to bf16 in memory first."""
    return _decoded(partial(launch_grouped, experts=experts, offs=offs), a, b, _experts_out(a, b, experts, out_dtype))


def grouped_wgrad_tc_triton(a: Operand, b: Operand, ends: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """(E, M, N) 2d x 2d product of K-grouped ``a`` (M, KP) and ``b`` (N, KP) (``launch_wgrad``'s layout), tiles
    decoded in registers."""
    return _in_registers(partial(launch_wgrad, ends=ends), a, b, _wgrad_out(a, b, ends, out_dtype))


def grouped_wgrad_decoded(a: Operand, b: Operand, ends: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``grouped_wgrad_tc_triton``'s product with the operands decoded to bf16 in memory first."""
    return _decoded(partial(launch_wgrad, ends=ends), a, b, _wgrad_out(a, b, ends, out_dtype))
