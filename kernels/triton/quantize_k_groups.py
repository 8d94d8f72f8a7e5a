"""Triton quantization of an experts' wgrad operand (2d x 2d), whose token groups run along the blocked dim: every
group in one launch, each quantized exactly as ``grouped.grouped_mm`` quantizes it alone — its tokens zero-padded
to whole blocks, NVFP4 with the group's own tensor scale, SR bits from the group's stream
``sr_stream(group_seed(seed, g), step)`` indexed as in the padded group — with the cumulative ends ``offs`` and the
step read on the device.

Stored layout: a (R, KP) quantization blocked along KP (codes (R, KP/2) for NVFP4, (R, KP) for MXFP8; scales
(R, KP/block)) in which group g's blocks start at padded column ``pad_ends[g-1]`` (0 for the first) and fill
``ceil(tokens_g / GROUP_PAD) · GROUP_PAD`` columns, zeros past its tokens; columns past the last group are zeros.
KP, ``ceil(T / GROUP_PAD) · GROUP_PAD + E · GROUP_PAD``, bounds the padded total whatever the group sizes, so
nothing is read on the host. A quantize tile never spans two groups (its width divides GROUP_PAD), and the
grouped wgrad GEMM (``grouped_mm_triton``) reads each group's columns in tiles of its own.

Tokens along the unit-stride dim take the tile kernels; tokens down a strided dim (a row-major (T, N) right
operand, a transposed left one) take slice kernels built from ``quantize_cols_triton``'s pieces, each thread
holding whole blocks.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoprec.formats import NVFP4, Format

from ..core.group_offsets import GROUP_PAD, padded_ends, padded_width
from ..core.launch import cdiv, nvfp4_hardware
from . import quantize_cols as qc
from .autotune import autotune, fixed_tile
from .block_scales import atomic_max_bits, tensor_scales
from .quantize_grouped import MXFP8_CONFIGS, NVFP4_CONFIGS, group_sr_keys, seed_arg
from .quantize_rows import (
    AMAX_TILE,
    INTERPRETER_TILE,
    KEY_ARGS,
    _load_tile,
    mxfp8_encode_store,
    mxfp8_meta,
    nvfp4_encode_store,
    rht_operand,
)
from .slices import load_slices


@triton.jit
def _k_group(offs_ptr, pad_ends_ptr, col0, T, E, EP: tl.constexpr):
    """(group g of padded column ``col0``, E past the last group; its first token; its token count; its first
    padded column). Group bounds are held to 0 .. T: offsets out of range read no token past the input."""
    e = tl.arange(0, EP)
    g = tl.sum((tl.load(pad_ends_ptr + e, mask=e < E, other=0x7FFFFFFF) <= col0).to(tl.int32))
    first_col = tl.load(pad_ends_ptr + g - 1, mask=g > 0, other=0)
    start = tl.minimum(tl.maximum(tl.load(offs_ptr + g - 1, mask=g > 0, other=0), 0), T)
    end = tl.minimum(tl.maximum(tl.load(offs_ptr + g, mask=g < E, other=0), 0), T)
    return g, start, tl.maximum(end - start, 0), first_col


@triton.jit
def _group_tile(x_ptr, m_ptr, offs_ptr, pad_ends_ptr, rows, col0, R, T, s_r, s_k, E, EP: tl.constexpr,
                BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr):
    """(g, the group's token count, the tile's first column within the group, the [BR, BK/16, 16] fp32 tile of
    padded columns ``col0`` on: the group's tokens, zeros past them, with the RHT along them)."""
    g, start, n, first_col = _k_group(offs_ptr, pad_ends_ptr, col0, T, E, EP)
    j0 = col0 - first_col
    y = _load_tile(x_ptr + tl.cast(start, tl.int64) * s_k, m_ptr, rows, j0, R, n, s_r, s_k, BR, BK, RHT)
    return g, n, j0, y


@triton.jit
def _k_groups_amax_kernel(x_ptr, m_ptr, offs_ptr, pad_ends_ptr, amax_ptr, R, T, s_r, s_k, E, EP: tl.constexpr,
                          BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr):
    """Each group's max|x| over its finite values into the int32 ``amax_ptr[g]`` (E + 1 of them, zeroed first):
    one atomic per tile."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    g, _, _, y = _group_tile(x_ptr, m_ptr, offs_ptr, pad_ends_ptr, rows, tl.program_id(1) * BK, R, T, s_r, s_k, E,
                             EP, BR, BK, RHT)
    a = tl.abs(y)
    atomic_max_bits(amax_ptr + g, tl.max(tl.max(tl.max(tl.where(a < float("inf"), a, 0.0), 2), 1), 0))


@triton.jit
def _sr_keys(seed, g, step_ptr, n, r_r, BLOCK: tl.constexpr, GROUP_ROWS: tl.constexpr, SR: tl.constexpr):
    """(k1, k2 of group g's stream, 0, 0 without SR; the SR row stride: the group's block-padded token count with
    GROUP_ROWS, else ``r_r``)."""
    k1, k2 = group_sr_keys(seed, g, step_ptr, SR)
    if GROUP_ROWS:
        r_r = (n + BLOCK - 1) // BLOCK * BLOCK
    return k1, k2, r_r


@autotune(NVFP4_CONFIGS, INTERPRETER_TILE, ["R", "KP", "s_k", "RHT", "SR"])
@triton.jit(do_not_specialize=KEY_ARGS[:1])
def _nvfp4_k_groups_kernel(x_ptr, m_ptr, offs_ptr, pad_ends_ptr, step_ptr, k1, codes_ptr, scales_ptr, amax_ptr, ts_ptr,
                           R, KP, T, s_r, s_k, r_r, r_k, E, EP: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
                           RHT: tl.constexpr, SR: tl.constexpr, GROUP_ROWS: tl.constexpr,
                           HW: tl.constexpr):
    """NVFP4 of tile (program ids) of the padded (R, KP) layout under its group's tensor scales (``k1``: the operand
    seed; SR index strides ``r_r``, ``r_k`` within the padded group); program (0, 0) writes every group's decode
    scale to ``ts_ptr``."""
    pid_r, col0 = tl.program_id(0), tl.program_id(1) * BK
    rows = pid_r * BR + tl.arange(0, BR)
    g, n, j0, y = _group_tile(x_ptr, m_ptr, offs_ptr, pad_ends_ptr, rows, col0, R, T, s_r, s_k, E, EP, BR, BK, RHT)
    a, b, rr = _sr_keys(k1, g, step_ptr, n, r_r, 16, GROUP_ROWS, SR)
    nvfp4_encode_store(y, amax_ptr, g, ts_ptr, False, x_ptr, a, b, rows, j0, rr, r_k, codes_ptr, scales_ptr, rows,
                       col0, R, KP, pid_r, BR, BK, SR, 1, False, True, HW)
    _store_group_decode_scales(amax_ptr, ts_ptr, E, EP)


@autotune(MXFP8_CONFIGS, INTERPRETER_TILE, ["R", "KP", "s_k", "RHT", "SR"])
@triton.jit(do_not_specialize=KEY_ARGS[:1])
def _mxfp8_k_groups_kernel(x_ptr, m_ptr, offs_ptr, pad_ends_ptr, step_ptr, k1, codes_ptr, scales_ptr,
                           R, KP, T, s_r, s_k, r_r, r_k, E, EBITS: tl.constexpr, MBITS: tl.constexpr,
                           BIAS: tl.constexpr, EMAX: tl.constexpr, MAX: tl.constexpr, FLOOR: tl.constexpr,
                           HW: tl.constexpr, EP: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr,
                           SR: tl.constexpr, GROUP_ROWS: tl.constexpr):
    """MXFP8 of tile (program ids) of the padded (R, KP) layout, SR bits from its group's stream."""
    col0 = tl.program_id(1) * BK
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    g, n, j0, y = _group_tile(x_ptr, m_ptr, offs_ptr, pad_ends_ptr, rows, col0, R, T, s_r, s_k, E, EP, BR, BK, RHT)
    a, b, rr = _sr_keys(k1, g, step_ptr, n, r_r, 32, GROUP_ROWS, SR)
    mxfp8_encode_store(y, x_ptr, a, b, rows, j0, rr, r_k, codes_ptr, scales_ptr, rows, col0, R, KP, EBITS, MBITS,
                       BIAS, EMAX, MAX, FLOOR, HW, BR, BK, SR, 1)


@triton.jit
def _group_slices(x_ptr, m_ptr, offs_ptr, pad_ends_ptr, R, T, s_r, s_k, E, EP: tl.constexpr, W: tl.constexpr,
                  BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr):
    """``_group_tile`` in W slices (``slices.load_slices``): (rows, the padded columns of the tile's
    blocks, g, the group's token count, the blocks' first columns within the group, the slices)."""
    rows, out_c0 = qc.tile_blocks(tl.program_id(0), tl.program_id(1), W, BR, BK)
    g, start, n, first_col = _k_group(offs_ptr, pad_ends_ptr, tl.program_id(1) * BK, T, E, EP)
    c0 = out_c0 - first_col
    ys = load_slices(x_ptr + tl.cast(start, tl.int64) * s_k, m_ptr, rows, c0, R, n, s_r, s_k, W, RHT)
    return rows, out_c0, g, n, c0, ys


@triton.jit
def _group_sr_index(k1, g, step_ptr, n, rows, c0, r_r, r_k, W: tl.constexpr, GROUP_ROWS: tl.constexpr,
                    SR: tl.constexpr):
    """(group g's SR keys, the row-major indices within the padded group of the blocks' first elements)."""
    a, b, rr = _sr_keys(k1, g, step_ptr, n, r_r, W, GROUP_ROWS, SR)
    return a, b, rows.to(tl.int64)[:, None] * rr + c0.to(tl.int64)[None, :] * r_k


@triton.jit
def _store_group_decode_scales(amax_ptr, ts_ptr, E, EP: tl.constexpr):
    """Every group's NVFP4 decode scale, from its amax bits (program (0, 0) alone)."""
    if tl.program_id(0) == 0 and tl.program_id(1) == 0:
        e = tl.arange(0, EP)
        _, s_dec = tensor_scales(tl.load(amax_ptr + e, mask=e < E, other=0).to(tl.float32, bitcast=True))
        tl.store(ts_ptr + e, s_dec, mask=e < E)


@autotune(qc.NVFP4_CONFIGS, qc.INTERPRETER_TILE, ["R", "KP", "s_r", "RHT", "SR"])
@triton.jit(do_not_specialize=KEY_ARGS[:1])
def _nvfp4_k_groups_cols_kernel(x_ptr, m_ptr, offs_ptr, pad_ends_ptr, step_ptr, k1, codes_ptr, scales_ptr, amax_ptr,
                                ts_ptr, R, KP, T, s_r, s_k, r_r, r_k, E, EP: tl.constexpr, BR: tl.constexpr,
                                BK: tl.constexpr, RHT: tl.constexpr, SR: tl.constexpr, GROUP_ROWS: tl.constexpr,
                                HW: tl.constexpr):
    """``_nvfp4_k_groups_kernel`` for tokens read down a strided dim, in slices (``quantize_cols_triton``)."""
    rows, out_c0, g, n, c0, ys = _group_slices(x_ptr, m_ptr, offs_ptr, pad_ends_ptr, R, T, s_r, s_k, E, EP, 16, BR,
                                               BK, RHT)
    a, b, idx = _group_sr_index(k1, g, step_ptr, n, rows, c0, r_r, r_k, 16, GROUP_ROWS, SR)
    qc.nvfp4_store_slices(ys, amax_ptr, g, ts_ptr, False, x_ptr, a, b, idx, r_k, rows, R, c0, n, out_c0, KP,
                          codes_ptr, scales_ptr, SR, 1, True, HW)
    _store_group_decode_scales(amax_ptr, ts_ptr, E, EP)


@autotune(qc.MXFP8_CONFIGS, qc.INTERPRETER_TILE, ["R", "KP", "s_r", "RHT", "SR"])
@triton.jit(do_not_specialize=KEY_ARGS[:1])
def _mxfp8_k_groups_cols_kernel(x_ptr, m_ptr, offs_ptr, pad_ends_ptr, step_ptr, k1, codes_ptr, scales_ptr,
                                R, KP, T, s_r, s_k, r_r, r_k, E, EBITS: tl.constexpr, MBITS: tl.constexpr,
                                BIAS: tl.constexpr, EMAX: tl.constexpr, MAX: tl.constexpr, FLOOR: tl.constexpr,
                                HW: tl.constexpr, EP: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
                                RHT: tl.constexpr, SR: tl.constexpr, GROUP_ROWS: tl.constexpr):
    """``_mxfp8_k_groups_kernel`` for tokens read down a strided dim, in slices."""
    rows, out_c0, g, n, c0, ys = _group_slices(x_ptr, m_ptr, offs_ptr, pad_ends_ptr, R, T, s_r, s_k, E, EP, 32, BR,
                                               BK, RHT)
    a, b, idx = _group_sr_index(k1, g, step_ptr, n, rows, c0, r_r, r_k, 32, GROUP_ROWS, SR)
    qc.mxfp8_store_slices(ys, x_ptr, a, b, idx, r_k, rows, R, c0, n, out_c0, KP, codes_ptr, scales_ptr, EBITS, MBITS,
                          BIAS, EMAX, MAX, FLOOR, HW, SR, 1)


@triton.jit
def _k_groups_amax_rht_cols_kernel(x_ptr, m_ptr, offs_ptr, pad_ends_ptr, amax_ptr, R, T, s_r, s_k, E,
                                   EP: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):
    """``_k_groups_amax_kernel`` with the RHT along tokens read down a strided dim, in slices."""
    _, _, g, _, _, ys = _group_slices(x_ptr, m_ptr, offs_ptr, pad_ends_ptr, R, T, s_r, s_k, E, EP, 16, BR, BK, True)
    atomic_max_bits(amax_ptr + g, tl.max(tl.max(qc.finite_amax(ys), 1), 0))


def quantize_k_groups_triton(x: torch.Tensor, fmt: Format, axis: int, offs: torch.Tensor, *, seed: int | None,
                             step: torch.Tensor, scale_mode: str = "rceil", rht: bool = False,
                             rht_signs_: torch.Tensor | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(codes, scales, per-group decode scales: E fp32 for NVFP4, else None, padded ends) of 2D ``x`` quantized
    along ``axis``, the token dim, in groups ending at ``offs``: a wgrad's left operand (M, T) with ``axis`` 1, its
    right operand (T, N) with ``axis`` 0; laid out as the module doc says. ``seed``: the operand's SR seed (None:
    round to nearest), each group's bits indexed as in its padded (M, L) or (L, N) tensor; ``step``: the model's
    call counter (an int64 device scalar)."""
    m = x if axis == 1 else x.t()
    n_rows, tokens = m.shape
    groups = offs.shape[0]
    ep = max(triton.next_power_of_2(groups), 2)
    kp = padded_width(tokens, groups)
    ends = padded_ends(offs.to(torch.int32), GROUP_PAD)
    key = seed_arg(seed)
    mt = rht_operand(x, rht, rht_signs_)
    grid = lambda meta: (cdiv(n_rows, meta["BR"]), kp // meta["BK"])  # noqa: E731
    # SR index within a padded group: (M, L) row-major for the left operand (its row stride, L, per group: the
    # kernel's GROUP_ROWS), (L, N) for the right one
    view = dict(R=n_rows, KP=kp, T=tokens, s_r=m.stride(0), s_k=m.stride(1), r_r=1, r_k=1 if axis == 1 else n_rows,
                E=groups, EP=ep, RHT=rht, SR=seed is not None, GROUP_ROWS=axis == 1)
    sliced = m.stride(1) != 1  # tokens read down a strided dim: the slice kernels
    if fmt is NVFP4:
        amax = torch.zeros(groups + 1, device=x.device, dtype=torch.int32)
        if sliced and rht:
            cfg = fixed_tile(qc.RHT_AMAX_TILE, qc.INTERPRETER_TILE)  # widths divide GROUP_PAD
            _k_groups_amax_rht_cols_kernel[(cdiv(n_rows, cfg["BR"]), kp // cfg["BK"])](
                m, mt, offs, ends, amax, n_rows, tokens, m.stride(0), m.stride(1), groups, EP=ep, **cfg)
        else:
            tile = fixed_tile(AMAX_TILE, INTERPRETER_TILE)
            _k_groups_amax_kernel[(cdiv(n_rows, tile["BR"]), kp // tile["BK"])](
                m, mt, offs, ends, amax, n_rows, tokens, m.stride(0), m.stride(1), groups, EP=ep, RHT=rht, **tile)
        codes = torch.empty(n_rows, kp // 2, device=x.device, dtype=torch.uint8)
        scales = torch.empty(n_rows, kp // 16, device=x.device, dtype=torch.uint8)
        s_dec = torch.empty(groups, device=x.device, dtype=torch.float32)
        args = (m, mt, offs, ends, step, key, codes, scales, amax, s_dec)
        if sliced:
            _nvfp4_k_groups_cols_kernel[grid](*args, **view, HW=nvfp4_hardware(x.device))
        else:
            _nvfp4_k_groups_kernel[grid](*args, **view, HW=nvfp4_hardware(x.device))
        return codes, scales.view(torch.float8_e4m3fn), s_dec, ends
    codes = torch.empty(n_rows, kp, device=x.device, dtype=torch.uint8)
    scales = torch.empty(n_rows, kp // 32, device=x.device, dtype=torch.uint8)
    args, meta = (m, mt, offs, ends, step, key, codes, scales), view | mxfp8_meta(fmt, scale_mode, x.device)
    if sliced:
        _mxfp8_k_groups_cols_kernel[grid](*args, **meta)
    else:
        _mxfp8_k_groups_kernel[grid](*args, **meta)
    return codes.view(fmt.elem.torch_dtype), scales, None, ends
