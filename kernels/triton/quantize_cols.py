"""Triton NVFP4 and MXFP8 quantizers for blocks read down a strided dim (the columnwise copies wgrad needs), in
slices: each thread holds whole blocks, so nothing crosses threads.

``quantize_triton``'s tile kernels load a [BR, BK/16, 16] tile whose block axis Triton spreads over threads when it
is the strided one: each block's amax is then a cross-thread reduction, and the codes pass through shared memory on
their way to the store. Here a tile is W slices (W = 16 or 32, the block size), slice j holding element j of each
of the tile's [BR, BK/W] blocks; every slice has the same layout (threads along R, whose reads are contiguous), so a
block's amax, RHT and codes are per-thread work on registers, and only the packed bytes of a block are joined
(in-thread) for one store. Compiled for sm_90 a bf16 column copy (NVFP4, SR + RHT) takes about half the
instructions per element of the tile kernel's (tests/ptx_report.py).

Same arguments, bytes and SR bits as ``_nvfp4_kernel`` / ``_mxfp8_kernel`` (the RHT: ``slices.rht16``); no
16x16 tiles (``TILE2D``). The K-grouped quantizers (``quantize_k_groups_triton``) build their slice kernels from
the same pieces.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoprec.formats import NVFP4, Format

from ..core.launch import cdiv, nvfp4_hardware
from ..core.quantized import QuantCopy
from .autotune import autotune, fixed_tile
from .block_scales import (
    FINITE_BIAS,
    INF_BITS,
    atomic_max_bits,
    e4m3_codes,
    mxfp8_block_exponents,
    nvfp4_block_scales,
)
from .numerics import (
    e2m1_pair,
    pow2,
    round_and_encode_fp8,
    sr_hash_bits,
    step_stream_keys,
)
from .quantize_rows import (
    AMAX_PROGRAMS,
    KEY_ARGS,
    as_matrix,
    mxfp8_meta,
    nvfp4_amax,
    rht_operand,
    tile_grid,
)
from .slices import join_slices, load_slices, rht16

# (BR, BK, warps) a GPU tunes over: 16 or 32 NVFP4 elements per thread, 64 MXFP8 (at 32, one row of a block
# column per thread, its SR keys' fixed work made 70 sm_90 instructions per element against 58). Not yet timed
# or checked on a GPU (tests/test_gpu_quantize.py forces each).
NVFP4_CONFIGS = [triton.Config({"BR": br, "BK": bk}, num_warps=w) for br, bk, w in (
    (128, 16, 4), (256, 16, 4), (256, 32, 8), (512, 16, 8))]
MXFP8_CONFIGS = [triton.Config({"BR": br, "BK": bk}, num_warps=w) for br, bk, w in (
    (256, 32, 4), (512, 32, 8), (256, 64, 8))]
# The interpreter's tile, far too wide for a GPU's registers: the interpreter's cost is per program and per op, so
# wide tiles run it faster than the GPU's, and 128 columns (the widest a K-grouped tile may be: GROUP_PAD) halve the
# programs of 64 (an MXFP8 K-grouped 32 x 300 quantization, tokens strided: 5.0 s, 10.2 s at 1024 x 64, 19.2 s at
# the GPU's 256 x 32).
INTERPRETER_TILE = triton.Config({"BR": 256, "BK": 128}, num_warps=8)
RHT_AMAX_TILE = {"BR": 256, "BK": 32}  # the RHT amax pass's tile on a GPU (4 warps: 32 elements per thread)


@triton.jit
def sr_keys(rand_ptr, k1, k2, HASH: tl.constexpr):
    """The SR stream's keys as ``_load_rand`` takes them (HASH 1: ``k1``, ``k2``; 2: a ``StepStream``'s)."""
    a, b = k1.to(tl.uint32, bitcast=True), k2.to(tl.uint32, bitcast=True)
    if HASH == 2:
        a, b = step_stream_keys(a, rand_ptr)
    return a, b


@triton.jit
def slice_bits(rand_ptr, a, b, idx, rows, R, c0, K, r_k, j: tl.constexpr, HASH: tl.constexpr):
    """SR bits of slice j (columns ``c0 + j`` of rows ``rows``), whose column ``c0`` elements have row-major
    indices ``idx`` (``r_k`` apart along K): hashed from keys ``a``, ``b``, or (HASH 0) loaded."""
    idx = idx + tl.full((), j, tl.int64) * r_k  # int64: r_k may be 1, a constant then
    if HASH:
        bits = sr_hash_bits(idx, a, b)
    else:
        bits = tl.load(rand_ptr + idx, mask=(rows < R)[:, None] & (c0 + j < K)[None, :], other=0)
    return bits


@triton.jit
def tile_blocks(pid_r, pid_k, W: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):
    """(rows, the blocks' first columns) of tile (``pid_r``, ``pid_k``) of BR x BK, in W-element blocks."""
    return pid_r * BR + tl.arange(0, BR), pid_k * BK + tl.arange(0, BK // W) * W


@triton.jit
def _store_joined(ptr, rows, R, c0, row_len, values, n: tl.constexpr):
    """Store the n byte slices ``values`` of each block (slice b at column ``c0 + b`` of rows ``rows``, ``row_len``
    bytes per row) as one joined [BR, NB, n] store, masked to the matrix's bytes."""
    cols = c0[:, None] + tl.arange(0, n)[None, :]
    mask = (rows < R)[:, None, None] & (cols < row_len)[None, :, :]
    tl.store(ptr + rows.to(tl.int64)[:, None, None] * row_len + cols[None, :, :], join_slices(values, n),
             mask=mask)


@triton.jit
def nvfp4_store_slices(ys, amax_ptr, amax_idx, ts_ptr, first, rand_ptr, a, b, idx, r_k, rows, R, c0, K, out_c0,
                       K_out, codes_ptr, scales_ptr, SR: tl.constexpr, HASH: tl.constexpr, GROUPED: tl.constexpr,
                       HW: tl.constexpr):
    """NVFP4 codes and scales of the 16 slices ``ys`` (blocks at columns ``c0`` of a (R, K) view; SR bits as
    ``slice_bits`` makes them from ``idx``), under the tensor scales of the amax bits at ``amax_ptr + amax_idx``
    (``nvfp4_block_scales``), stored at columns ``out_c0`` of the (R, K_out) output."""
    amax_bits = ys[0].to(tl.int32, bitcast=True) & 0x7FFFFFFF  # ordered as |y|, Inf and NaN above (a NaN scale)
    for j in tl.static_range(1, 16):
        amax_bits = tl.maximum(amax_bits, ys[j].to(tl.int32, bitcast=True) & 0x7FFFFFFF)
    s_b, e_b = nvfp4_block_scales(amax_bits, amax_ptr, amax_idx, ts_ptr, first, GROUPED, HW >= 1)
    mask = (rows < R)[:, None] & (out_c0 // 16 < K_out // 16)[None, :]  # whole blocks: a block cut by K has codes
    tl.store(scales_ptr + rows.to(tl.int64)[:, None] * (K_out // 16) + (out_c0 // 16)[None, :],
             e4m3_codes(s_b, HW >= 1), mask=mask)
    packed = ()
    for m in tl.static_range(8):
        rand_lo, rand_hi = 0, 0
        if SR:
            rand_lo = slice_bits(rand_ptr, a, b, idx, rows, R, c0, K, r_k, 2 * m, HASH)
            rand_hi = slice_bits(rand_ptr, a, b, idx, rows, R, c0, K, r_k, 2 * m + 1, HASH)
        packed = packed + (e2m1_pair(ys[2 * m] * e_b, ys[2 * m + 1] * e_b, rand_lo, rand_hi, e_b != e_b, SR,
                                     HW == 2).to(tl.uint8),)
    _store_joined(codes_ptr, rows, R, out_c0 // 2, K_out // 2, packed, 8)


@triton.jit
def mxfp8_store_slices(ys, rand_ptr, a, b, idx, r_k, rows, R, c0, K, out_c0, K_out, codes_ptr, scales_ptr,
                       EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, EMAX: tl.constexpr,
                       MAX: tl.constexpr, FLOOR: tl.constexpr, HW: tl.constexpr, SR: tl.constexpr, HASH: tl.constexpr):
    """MXFP8 codes and E8M0 scales of the 32 slices ``ys``, stored as ``nvfp4_store_slices`` stores its."""
    finite = tl.full(ys[0].shape, FINITE_BIAS, tl.int32)  # the largest |y| bits of finite values (+ FINITE_BIAS)
    top = tl.zeros(ys[0].shape, tl.int32)  # and of all
    for j in tl.static_range(32):
        abs_bits = ys[j].to(tl.int32, bitcast=True) & 0x7FFFFFFF
        finite = tl.maximum(finite, abs_bits + FINITE_BIAS)
        top = tl.maximum(top, abs_bits)
    e = mxfp8_block_exponents((finite - FINITE_BIAS).to(tl.float32, bitcast=True), EMAX, MAX, FLOOR)
    mask = (rows < R)[:, None] & (out_c0 // 32 < K_out // 32)[None, :]
    tl.store(scales_ptr + rows.to(tl.int64)[:, None] * (K_out // 32) + (out_c0 // 32)[None, :],
             tl.where(top >= INF_BITS, 255, e + 127).to(tl.uint8), mask=mask)
    scale = pow2(-e)
    codes = ()
    for j in tl.static_range(32):
        rand = 0
        if SR:
            rand = slice_bits(rand_ptr, a, b, idx, rows, R, c0, K, r_k, j, HASH)
        codes = codes + (round_and_encode_fp8(ys[j] * scale, rand, EBITS, MBITS, BIAS, MAX, SR, HW).to(tl.uint8),)
    _store_joined(codes_ptr, rows, R, out_c0, K_out, codes, 32)


@triton.jit
def _sr_index(rand_ptr, k1, k2, rows, c0, r_r, r_k, SR: tl.constexpr, HASH: tl.constexpr):
    """(the SR keys, the row-major indices of the blocks' first elements) of the slice kernels (0s without SR)."""
    a, b, idx = 0, 0, 0
    if SR:
        a, b = sr_keys(rand_ptr, k1, k2, HASH)
        idx = rows.to(tl.int64)[:, None] * r_r + c0.to(tl.int64)[None, :] * r_k
    return a, b, idx


@autotune(NVFP4_CONFIGS, INTERPRETER_TILE, ["R", "K", "s_r", "RHT", "SR"])
@triton.jit(do_not_specialize=KEY_ARGS)
def _nvfp4_cols_kernel(x_ptr, m_ptr, rand_ptr, k1, k2, codes_ptr, scales_ptr, amax_ptr, ts_ptr, R, K, s_r, s_k, r_r,
                       r_k, BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr, SR: tl.constexpr,
                       HASH: tl.constexpr, HW: tl.constexpr):
    nvfp4_slices_tile(x_ptr, m_ptr, rand_ptr, k1, k2, codes_ptr, scales_ptr, amax_ptr, ts_ptr, R, K, s_r, s_k, r_r,
                      r_k, tl.program_id(0), tl.program_id(1), BR, BK, RHT, SR, HASH, HW)


@triton.jit
def nvfp4_slices_tile(x_ptr, m_ptr, rand_ptr, k1, k2, codes_ptr, scales_ptr, amax_ptr, ts_ptr, R, K, s_r, s_k, r_r,
                      r_k, pid_r, pid_k, BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr, SR: tl.constexpr,
                      HASH: tl.constexpr, HW: tl.constexpr):
    """``quantize_rows.nvfp4_tile`` in slices: tile (``pid_r``, ``pid_k``) of the (R, K) view, the same bytes."""
    rows, c0 = tile_blocks(pid_r, pid_k, 16, BR, BK)
    ys = load_slices(x_ptr, m_ptr, rows, c0, R, K, s_r, s_k, 16, RHT)
    a, b, idx = _sr_index(rand_ptr, k1, k2, rows, c0, r_r, r_k, SR, HASH)
    nvfp4_store_slices(ys, amax_ptr, 0, ts_ptr, pid_r == 0 and pid_k == 0, rand_ptr, a, b, idx, r_k, rows, R, c0, K,
                       c0, K, codes_ptr, scales_ptr, SR, HASH, False, HW)


@autotune(MXFP8_CONFIGS, INTERPRETER_TILE, ["R", "K", "s_r", "RHT", "SR"])
@triton.jit(do_not_specialize=KEY_ARGS)
def _mxfp8_cols_kernel(x_ptr, m_ptr, rand_ptr, k1, k2, codes_ptr, scales_ptr, R, K, s_r, s_k, r_r, r_k,
                       EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, EMAX: tl.constexpr,
                       MAX: tl.constexpr, FLOOR: tl.constexpr, HW: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
                       RHT: tl.constexpr, SR: tl.constexpr, HASH: tl.constexpr):
    mxfp8_slices_tile(x_ptr, m_ptr, rand_ptr, k1, k2, codes_ptr, scales_ptr, R, K, s_r, s_k, r_r, r_k,
                      tl.program_id(0), tl.program_id(1), EBITS, MBITS, BIAS, EMAX, MAX, FLOOR, HW, BR, BK, RHT, SR,
                      HASH)


@triton.jit
def mxfp8_slices_tile(x_ptr, m_ptr, rand_ptr, k1, k2, codes_ptr, scales_ptr, R, K, s_r, s_k, r_r, r_k, pid_r, pid_k,
                      EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, EMAX: tl.constexpr,
                      MAX: tl.constexpr, FLOOR: tl.constexpr, HW: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
                      RHT: tl.constexpr, SR: tl.constexpr, HASH: tl.constexpr):
    """``quantize_rows.mxfp8_tile`` in slices: tile (``pid_r``, ``pid_k``) of the (R, K) view, the same bytes."""
    rows, c0 = tile_blocks(pid_r, pid_k, 32, BR, BK)
    ys = load_slices(x_ptr, m_ptr, rows, c0, R, K, s_r, s_k, 32, RHT)
    a, b, idx = _sr_index(rand_ptr, k1, k2, rows, c0, r_r, r_k, SR, HASH)
    mxfp8_store_slices(ys, rand_ptr, a, b, idx, r_k, rows, R, c0, K, c0, K, codes_ptr, scales_ptr, EBITS, MBITS, BIAS,
                       EMAX, MAX, FLOOR, HW, SR, HASH)


@triton.jit
def slices_amax(x_ptr, m_ptr, R, K, s_r, s_k, pid_r, pid_k, BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr):
    """``quantize_rows.tile_amax`` in slices: max|x| over the finite values of tile (``pid_r``, ``pid_k``)."""
    rows, c0 = tile_blocks(pid_r, pid_k, 16, BR, BK)
    return tl.max(tl.max(finite_amax(load_slices(x_ptr, m_ptr, rows, c0, R, K, s_r, s_k, 16, RHT)), 1), 0)


@triton.jit
def _amax_rht_cols_kernel(x_ptr, m_ptr, amax_ptr, plain_ptr, R, K, s_r, s_k, s_b, BR: tl.constexpr,
                          BK: tl.constexpr, PLAIN: tl.constexpr):
    """``_amax_kernel`` with the RHT along a strided K, in slices: max|RHT(x)| over the finite values of batch item
    ``program_id(1)`` (``s_b`` elements apart) into ``amax_ptr[item]``; with PLAIN, max|x| too, from the same read,
    into ``plain_ptr[item]`` (the tensor amax of a pair's copy without the RHT)."""
    item = tl.program_id(1)
    x_ptr += item.to(tl.int64) * s_b
    n_k = tl.cdiv(K, BK)
    amax = tl.zeros((BR, BK // 16), tl.float32)
    plain = tl.zeros((BR, BK // 16), tl.float32)
    for t in range(tl.program_id(0), tl.cdiv(R, BR) * n_k, tl.num_programs(0)):
        rows, c0 = tile_blocks(t // n_k, t % n_k, 16, BR, BK)
        xs = load_slices(x_ptr, m_ptr, rows, c0, R, K, s_r, s_k, 16, False)
        if PLAIN:  # before the transform: the loaded slices are dead once it has read them
            plain = tl.maximum(plain, finite_amax(xs))
        amax = tl.maximum(amax, finite_amax(rht16(xs, m_ptr, 0)))
    atomic_max_bits(amax_ptr + item, tl.max(tl.max(amax, 1), 0))
    if PLAIN:
        atomic_max_bits(plain_ptr + item, tl.max(tl.max(plain, 1), 0))


def launch_rht_amax(x: torch.Tensor, mt: torch.Tensor, amax: torch.Tensor, shape: tuple[int, int],
                    strides: tuple[int, int], s_b: int = 0, plain: torch.Tensor | None = None) -> None:
    """Launch ``_amax_rht_cols_kernel`` over the (R, K) views (``shape``, ``strides``) of ``amax.numel()`` batch
    items of ``x``, ``s_b`` apart: each item's max|RHT(x)| bits into its int32 ``amax`` cell (zeroed), and given
    ``plain`` (cells like ``amax``'s), its max|x| bits there, from the same read."""
    tile = fixed_tile(RHT_AMAX_TILE, INTERPRETER_TILE)
    tiles = cdiv(shape[0], tile["BR"]) * cdiv(shape[1], tile["BK"])
    _amax_rht_cols_kernel[(min(tiles, AMAX_PROGRAMS), amax.numel())](
        x, mt, amax, amax if plain is None else plain, *shape, *strides, s_b, PLAIN=plain is not None, **tile)


def pair_amax(x: torch.Tensor, rows: QuantCopy, cols: QuantCopy, rht_signs: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The NVFP4 tensor amax cells of a pair's copies of 2D ``x`` (at most one with the RHT) from one read: x's for
    both, or the RHT copy's transform's (along its K, as it quantizes) beside x's for the other."""
    if not rows.rht and not cols.rht:
        amax = nvfp4_amax(x, x, False)
        return amax, amax
    copy, axis = (rows, 1) if rows.rht else (cols, 0)
    src, axis = copy.source(x, axis)
    m = as_matrix(src, axis)
    cells = torch.zeros(2, device=x.device, dtype=torch.int32)
    launch_rht_amax(m, rht_operand(x, True, rht_signs), cells[:1], m.shape, m.stride(), plain=cells[1:])
    return (cells[0], cells[1]) if rows.rht else (cells[1], cells[0])


@triton.jit
def finite_amax(ys):
    """max |y| over the finite values of the slices ``ys``, per block ([BR, NB])."""
    amax = tl.zeros(ys[0].shape, tl.float32)
    for j in tl.static_range(len(ys)):
        a = tl.abs(ys[j])
        amax = tl.maximum(amax, tl.where(a < float("inf"), a, 0.0))
    return amax


def quantize_cols(fmt: Format, args: tuple, s_dec: torch.Tensor | None, r_strides: tuple[int, int], scale_mode: str,
                  flags: dict, amax: torch.Tensor | None = None) -> None:
    """Launch the slice kernels for ``quantize_triton``: ``args`` = (m, its RHT signs, rand_ptr, k1, k2, codes,
    scales), ``m`` the (R, K) view; NVFP4's tensor amax first (with the RHT, in slices too) unless given."""
    m, mt = args[:2]
    grid = tile_grid(m)
    if fmt is not NVFP4:
        _mxfp8_cols_kernel[grid](*args, *m.shape, *m.stride(), *r_strides, **mxfp8_meta(fmt, scale_mode, m.device),
                                 **flags)
        return
    if amax is None and flags["RHT"]:
        amax = torch.zeros((), device=m.device, dtype=torch.int32)
        launch_rht_amax(m, mt, amax, m.shape, m.stride())
    elif amax is None:
        amax = nvfp4_amax(m, mt, False)
    _nvfp4_cols_kernel[grid](*args, amax, s_dec, *m.shape, *m.stride(), *r_strides, HW=nvfp4_hardware(m.device),
                             **flags)
