"""Triton quantization of a grouped GEMM's operands, every group at once, each group quantized exactly as
``grouped.grouped_mm`` quantizes it alone: NVFP4 with the group's own tensor scale (one amax per group), SR
bits from the group's stream ``sr_stream(group_seed(seed, g), step)`` indexed within the group.

- Token groups (``quantize_row_groups_triton``): x (T, K) with its rows in groups given by the cumulative ends
  ``offs``, which the kernels read on the device; rows past the last offset are quantized as one more group,
  which no product reads.
- Expert weights (``quantize_batches_triton``): each item of a 3D (E, K, N) tensor blocked along K, the grid's
  third axis, read in place through its strides. Blocks down a strided K (the weights as they lie) take slice
  kernels built from ``quantize_cols_triton``'s pieces, each thread holding whole blocks; a unit-stride K, or
  NVFP4's 16x16 tiles, the tile kernels.

Either may quantize its operand as if zero-padded along K to whole blocks (``k_padded``: loads masked at the
stored K, codes laid out for the padded one), as a group alone is padded, with no padded copy.

An NVFP4 quantization is three launches (zeroing, per-group amaxes, the quantize kernel) and an MXFP8 one is
one, whatever the number of groups.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoprec.formats import NVFP4, Format

from ..core.launch import cdiv, nvfp4_hardware
from ..core.random_bits import M32
from . import quantize_cols as qc
from .autotune import autotune, fixed_tile
from .block_scales import tensor_scales
from .numerics import group_stream_keys
from .quantize_rows import (
    AMAX_TILE,
    GPU_CHECKED,
    INTERPRETER_TILE,
    KEY_ARGS,
    MXFP8_GPU_CONFIGS,
    _load_tile,
    int32_arg,
    launch_amax,
    mxfp8_encode_store,
    mxfp8_meta,
    nvfp4_encode_store,
    rht_operand,
)
from .slices import load_slices

# The tiles of 8 elements per thread that a GPU has checked (MXFP8: less the one it found wrong). At the
# 32-element tiles the per-row group lookup and SR keys push the kernels to 255 registers and spill
# (tests/ptx_report.py).
NVFP4_CONFIGS = GPU_CHECKED
MXFP8_CONFIGS = [c for c in MXFP8_GPU_CONFIGS if c in GPU_CHECKED]


@triton.jit
def _row_groups(offs_ptr, rows, E, EP: tl.constexpr):
    """The group of each of ``rows`` (E for a row past the last of the ``E`` cumulative ends at ``offs_ptr``;
    EP: E rounded up to a power of two) and that group's first row."""
    e = tl.arange(0, EP)
    ends = tl.load(offs_ptr + e, mask=e < E, other=0x7FFFFFFF)
    g = tl.sum((ends[None, :] <= rows[:, None]).to(tl.int32), 1)
    start = tl.load(offs_ptr + g - 1, mask=g > 0, other=0)
    return g, start


@triton.jit
def _group_amax_kernel(x_ptr, m_ptr, offs_ptr, amax_ptr, R, K, s_r, s_k, E, EP: tl.constexpr, BR: tl.constexpr,
                       BK: tl.constexpr, RHT: tl.constexpr):
    """Each group's max|x| over its finite values, as fp32 bits into the int32 ``amax_ptr[g]`` (E + 1 of them,
    zeroed first; the last collects rows past the last offset). A program takes BR rows across K, then makes one
    atomic max where its rows are all in one group, else one per row."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    amax = tl.zeros((BR,), tl.float32)
    for k0 in range(0, K, BK):
        a = tl.abs(_load_tile(x_ptr, m_ptr, rows, k0, R, K, s_r, s_k, BR, BK, RHT))
        amax = tl.maximum(amax, tl.max(tl.max(tl.where(a < float("inf"), a, 0.0), 2), 1))
    g, _ = _row_groups(offs_ptr, rows, E, EP)
    valid = rows < R
    g_lo, g_hi = tl.min(tl.where(valid, g, E), 0), tl.max(tl.where(valid, g, 0), 0)
    if g_lo == g_hi:
        tl.atomic_max(amax_ptr + g_lo, tl.max(tl.where(valid, amax, 0.0), 0).to(tl.int32, bitcast=True))
    else:
        tl.atomic_max(amax_ptr + g, amax.to(tl.int32, bitcast=True), mask=valid)


@triton.jit
def group_sr_keys(seed, g, step_ptr, SR: tl.constexpr):
    """(k1, k2) of group ``g``'s SR stream (``g`` of any shape; ``seed``: the operand seed's int32 bits, as
    ``seed_arg`` passes them), 0, 0 without SR."""
    k1 = 0
    k2 = 0
    if SR:
        k1, k2 = group_stream_keys(seed.to(tl.uint32, bitcast=True), g, step_ptr)
    return k1, k2


@triton.jit
def _group_keys(seed, offs_ptr, step_ptr, rows, E, EP: tl.constexpr, SR: tl.constexpr):
    """(group of each row, SR bit index rows: each row's index within its group, keys k1, k2 of each row's group
    stream as [BR, 1, 1]; 0, 0 without SR)."""
    g, start = _row_groups(offs_ptr, rows, E, EP)
    k1, k2 = group_sr_keys(seed, g, step_ptr, SR)
    if SR:
        k1, k2 = k1[:, None, None], k2[:, None, None]
    return g, rows - start, k1, k2


@autotune(NVFP4_CONFIGS, INTERPRETER_TILE, ["R", "K", "s_k", "RHT", "SR"])
@triton.jit(do_not_specialize=KEY_ARGS[:1])
def _nvfp4_grouped_kernel(x_ptr, m_ptr, offs_ptr, step_ptr, k1, codes_ptr, scales_ptr, amax_ptr, ts_ptr,
                          R, K, KL, s_r, s_k, E, EP: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
                          RHT: tl.constexpr, SR: tl.constexpr, HW: tl.constexpr):
    """NVFP4 of tile (program ids) of the (R, K) view, each row under its group's tensor scales (``k1``: the
    operand seed), its columns from KL on zeros (a reduction padded to whole blocks); program (0, 0) writes every
    group's decode scale to ``ts_ptr``."""
    pid_r, pid_k = tl.program_id(0), tl.program_id(1)
    rows = pid_r * BR + tl.arange(0, BR)
    g, sr_rows, a, b = _group_keys(k1, offs_ptr, step_ptr, rows, E, EP, SR)
    y = _load_tile(x_ptr, m_ptr, rows, pid_k * BK, R, KL, s_r, s_k, BR, BK, RHT)
    nvfp4_encode_store(y, amax_ptr, g[:, None], ts_ptr, False, x_ptr, a, b, sr_rows, pid_k * BK, K, 1, codes_ptr,
                       scales_ptr, rows, pid_k * BK, R, K, pid_r, BR, BK, SR, 1, False, True, HW)
    if pid_r == 0 and pid_k == 0:
        e = tl.arange(0, EP)
        _, s_dec = tensor_scales(tl.load(amax_ptr + e, mask=e < E, other=0).to(tl.float32, bitcast=True))
        tl.store(ts_ptr + e, s_dec, mask=e < E)


@autotune(MXFP8_CONFIGS, INTERPRETER_TILE, ["R", "K", "s_k", "RHT", "SR"])
@triton.jit(do_not_specialize=KEY_ARGS[:1])
def _mxfp8_grouped_kernel(x_ptr, m_ptr, offs_ptr, step_ptr, k1, codes_ptr, scales_ptr, R, K, KL, s_r, s_k, E,
                          EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, EMAX: tl.constexpr,
                          MAX: tl.constexpr, FLOOR: tl.constexpr, HW: tl.constexpr, EP: tl.constexpr, BR: tl.constexpr,
                          BK: tl.constexpr, RHT: tl.constexpr, SR: tl.constexpr):
    """MXFP8 of tile (program ids) of the (R, K) view, SR bits from each row's group stream, columns from KL on
    zeros."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    _, sr_rows, a, b = _group_keys(k1, offs_ptr, step_ptr, rows, E, EP, SR)
    y = _load_tile(x_ptr, m_ptr, rows, tl.program_id(1) * BK, R, KL, s_r, s_k, BR, BK, RHT)
    mxfp8_encode_store(y, x_ptr, a, b, sr_rows, tl.program_id(1) * BK, K, 1, codes_ptr, scales_ptr, rows,
                       tl.program_id(1) * BK, R, K, EBITS, MBITS, BIAS, EMAX, MAX, FLOOR, HW, BR, BK, SR, 1)


def seed_arg(seed: int | None) -> int:
    """The grouped kernels' ``k1``: the operand seed's low 32 bits as an int32 argument (0 without SR)."""
    return 0 if seed is None else int32_arg(seed & M32)


def quantize_row_groups_triton(x: torch.Tensor, fmt: Format, offs: torch.Tensor, *, seed: int | None,
                               step: torch.Tensor, scale_mode: str = "rceil", rht: bool = False,
                               rht_signs_: torch.Tensor | None = None, k_padded: int | None = None,
                               amax: torch.Tensor | None = None
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(codes, scales, per-group decode scales: E fp32 for NVFP4, else None) of 2D ``x`` quantized along dim 1,
    each row group on its own; laid out as ``quantize_triton`` lays out x's quantization, so group g's codes and
    scales are rows ``offs[g-1]:offs[g]``. ``seed``: the operand's SR seed (None: round to nearest); ``step``:
    the model's call counter (an int64 device scalar), read on the device. ``k_padded``: quantize x as if
    zero-padded to that many columns (whole blocks), the zeros made in the kernel. ``amax``: NVFP4's static tensor
    amax bits for every group (no amax pass then)."""
    n_rows, k_loaded = x.shape
    k = k_padded or k_loaded
    groups = offs.shape[0]
    ep = max(triton.next_power_of_2(groups), 2)
    key = seed_arg(seed)
    mt = rht_operand(x, rht, rht_signs_)
    grid = lambda meta: (cdiv(n_rows, meta["BR"]), cdiv(k, meta["BK"]))  # noqa: E731
    common = dict(EP=ep, RHT=rht, SR=seed is not None)
    if fmt is NVFP4:
        if amax is not None:
            amax = amax.reshape(1).expand(groups + 1).contiguous()
        else:
            amax = torch.zeros(groups + 1, device=x.device, dtype=torch.int32)
            tile = fixed_tile(AMAX_TILE, INTERPRETER_TILE)
            _group_amax_kernel[(cdiv(n_rows, tile["BR"]),)](x, mt, offs, amax, n_rows, k_loaded, x.stride(0),
                                                           x.stride(1), groups, EP=ep, RHT=rht, **tile)
        codes = torch.empty(n_rows, k // 2, device=x.device, dtype=torch.uint8)
        scales = torch.empty(n_rows, k // 16, device=x.device, dtype=torch.uint8)
        s_dec = torch.empty(groups, device=x.device, dtype=torch.float32)
        _nvfp4_grouped_kernel[grid](x, mt, offs, step, key, codes, scales, amax, s_dec, n_rows, k, k_loaded,
                                    x.stride(0), x.stride(1), groups, HW=nvfp4_hardware(x.device), **common)
        return codes, scales.view(torch.float8_e4m3fn), s_dec
    elem = fmt.elem
    codes = torch.empty(n_rows, k, device=x.device, dtype=torch.uint8)
    scales = torch.empty(n_rows, k // 32, device=x.device, dtype=torch.uint8)
    _mxfp8_grouped_kernel[grid](x, mt, offs, step, key, codes, scales, n_rows, k, k_loaded, x.stride(0), x.stride(1),
                                groups, **mxfp8_meta(fmt, scale_mode, x.device), **common)
    return codes.view(elem.torch_dtype), scales, None


@triton.jit
def _batch_item(x_ptr, seed, step_ptr, codes_ptr, scales_ptr, s_b, c_b, sc_b, SR: tl.constexpr):
    """(program's batch item, its source, codes and scales pointers, its group stream's keys; 0, 0 without SR)."""
    item = tl.program_id(2)
    k1, k2 = group_sr_keys(seed, item, step_ptr, SR)
    at = item.to(tl.int64)  # items of a large expert tensor lie past 2**31 elements
    return item, x_ptr + at * s_b, codes_ptr + at * c_b, scales_ptr + at * sc_b, k1, k2


@autotune(NVFP4_CONFIGS, INTERPRETER_TILE, ["R", "K", "s_k", "RHT", "SR", "TILE2D"])
@triton.jit(do_not_specialize=KEY_ARGS[:1])
def _nvfp4_batch_kernel(x_ptr, m_ptr, step_ptr, k1, codes_ptr, scales_ptr, amax_ptr, ts_ptr, R, K, KL, s_r, s_k, s_b,
                        r_r, r_k, c_b, sc_b, BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr,
                        SR: tl.constexpr, TILE2D: tl.constexpr, HW: tl.constexpr):
    """NVFP4 of tile (program ids 0, 1) of batch item ``program_id(2)``'s (R, K) view (K from KL on zeros), under
    its tensor scales; its tile (0, 0) writes its decode scale to ``ts_ptr[item]``."""
    item, x_ptr, codes_ptr, scales_ptr, a, b = _batch_item(x_ptr, k1, step_ptr, codes_ptr, scales_ptr, s_b, c_b,
                                                           sc_b, SR)
    pid_r, pid_k = tl.program_id(0), tl.program_id(1)
    rows = pid_r * BR + tl.arange(0, BR)
    y = _load_tile(x_ptr, m_ptr, rows, pid_k * BK, R, KL, s_r, s_k, BR, BK, RHT)
    nvfp4_encode_store(y, amax_ptr, item, ts_ptr + item, pid_r == 0 and pid_k == 0, x_ptr, a, b, rows, pid_k * BK,
                       r_r, r_k, codes_ptr, scales_ptr, rows, pid_k * BK, R, K, pid_r, BR, BK, SR, 1, TILE2D, False, HW)


@autotune(MXFP8_CONFIGS, INTERPRETER_TILE, ["R", "K", "s_k", "RHT", "SR"])
@triton.jit(do_not_specialize=KEY_ARGS[:1])
def _mxfp8_batch_kernel(x_ptr, m_ptr, step_ptr, k1, codes_ptr, scales_ptr, R, K, KL, s_r, s_k, s_b, r_r, r_k, c_b,
                        sc_b, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, EMAX: tl.constexpr,
                        MAX: tl.constexpr, FLOOR: tl.constexpr, HW: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
                        RHT: tl.constexpr, SR: tl.constexpr):
    """MXFP8 of tile (program ids 0, 1) of batch item ``program_id(2)``'s (R, K) view (K from KL on zeros)."""
    _, x_ptr, codes_ptr, scales_ptr, a, b = _batch_item(x_ptr, k1, step_ptr, codes_ptr, scales_ptr, s_b, c_b, sc_b,
                                                        SR)
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    y = _load_tile(x_ptr, m_ptr, rows, tl.program_id(1) * BK, R, KL, s_r, s_k, BR, BK, RHT)
    mxfp8_encode_store(y, x_ptr, a, b, rows, tl.program_id(1) * BK, r_r, r_k, codes_ptr, scales_ptr, rows,
                       tl.program_id(1) * BK, R, K, EBITS, MBITS, BIAS, EMAX, MAX, FLOOR, HW, BR, BK, SR, 1)


@triton.jit
def _batch_slices(x_ptr, m_ptr, step_ptr, k1, codes_ptr, scales_ptr, R, KL, s_r, s_k, s_b, r_r, r_k, c_b, sc_b,
                  W: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr, SR: tl.constexpr):
    """``_batch_item`` for the slice kernels (``quantize_cols_triton``): (item, its codes and scales pointers, its
    stream's keys, the SR indices of the blocks' first elements, rows, the blocks' first columns, the W slices of
    tile (program ids 0, 1), K from KL on zeros)."""
    item, x_ptr, codes_ptr, scales_ptr, a, b = _batch_item(x_ptr, k1, step_ptr, codes_ptr, scales_ptr, s_b, c_b,
                                                           sc_b, SR)
    rows, c0 = qc.tile_blocks(tl.program_id(0), tl.program_id(1), W, BR, BK)
    ys = load_slices(x_ptr, m_ptr, rows, c0, R, KL, s_r, s_k, W, RHT)
    idx = rows.to(tl.int64)[:, None] * r_r + c0.to(tl.int64)[None, :] * r_k
    return item, codes_ptr, scales_ptr, a, b, idx, rows, c0, ys


@autotune(qc.NVFP4_CONFIGS, qc.INTERPRETER_TILE, ["R", "K", "s_r", "RHT", "SR"])
@triton.jit(do_not_specialize=KEY_ARGS[:1])
def _nvfp4_batch_cols_kernel(x_ptr, m_ptr, step_ptr, k1, codes_ptr, scales_ptr, amax_ptr, ts_ptr, R, K, KL, s_r, s_k,
                             s_b, r_r, r_k, c_b, sc_b, BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr,
                             SR: tl.constexpr, HW: tl.constexpr):
    """``_nvfp4_batch_kernel`` for items blocked down a strided dim (an (E, K, N) weight as it lies), in slices."""
    item, codes_ptr, scales_ptr, a, b, idx, rows, c0, ys = _batch_slices(
        x_ptr, m_ptr, step_ptr, k1, codes_ptr, scales_ptr, R, KL, s_r, s_k, s_b, r_r, r_k, c_b, sc_b, 16, BR, BK,
        RHT, SR)
    qc.nvfp4_store_slices(ys, amax_ptr, item, ts_ptr + item, tl.program_id(0) == 0 and tl.program_id(1) == 0, x_ptr,
                          a, b, idx, r_k, rows, R, c0, KL, c0, K, codes_ptr, scales_ptr, SR, 1, False, HW)


@autotune(qc.MXFP8_CONFIGS, qc.INTERPRETER_TILE, ["R", "K", "s_r", "RHT", "SR"])
@triton.jit(do_not_specialize=KEY_ARGS[:1])
def _mxfp8_batch_cols_kernel(x_ptr, m_ptr, step_ptr, k1, codes_ptr, scales_ptr, R, K, KL, s_r, s_k, s_b, r_r, r_k,
                             c_b, sc_b, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                             EMAX: tl.constexpr, MAX: tl.constexpr, FLOOR: tl.constexpr, HW: tl.constexpr,
                             BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr, SR: tl.constexpr):
    """``_mxfp8_batch_kernel`` for items blocked down a strided dim, in slices."""
    _, codes_ptr, scales_ptr, a, b, idx, rows, c0, ys = _batch_slices(
        x_ptr, m_ptr, step_ptr, k1, codes_ptr, scales_ptr, R, KL, s_r, s_k, s_b, r_r, r_k, c_b, sc_b, 32, BR, BK,
        RHT, SR)
    qc.mxfp8_store_slices(ys, x_ptr, a, b, idx, r_k, rows, R, c0, KL, c0, K, codes_ptr, scales_ptr, EBITS, MBITS, BIAS,
                          EMAX, MAX, FLOOR, HW, SR, 1)


def quantize_batches_triton(x: torch.Tensor, fmt: Format, *, seed: int | None, step: torch.Tensor,
                            tile2d: bool = False, scale_mode: str = "rceil", rht: bool = False,
                            rht_signs_: torch.Tensor | None = None, sr_of_transpose: bool = False,
                            k_padded: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(codes (E, N, ...), scales (E, ...), per-item decode scales: E fp32 for NVFP4, else None) of each item
    x[e] of a 3D (E, K, N) tensor quantized along K (its dim 0) on its own, laid out as ``quantize_triton`` lays
    out x[e]'s quantization; ``seed``, ``step``: as ``quantize_row_groups_triton``'s. ``sr_of_transpose``: SR
    bits keyed on x[e]ᵀ's indices, so each item's codes are those of x[e]ᵀ (N, K) quantized along its rows (an
    operand stored transposed). ``k_padded``: as ``quantize_row_groups_triton``'s, along K."""
    items, k_loaded, n = x.shape
    k = k_padded or k_loaded
    key = seed_arg(seed)
    mt = rht_operand(x, rht, rht_signs_)
    grid = lambda meta: (cdiv(n, meta["BR"]), cdiv(k, meta["BK"]), items)  # noqa: E731
    r_r, r_k = (k, 1) if sr_of_transpose else (1, n)  # SR: x[e]ᵀ's indices, or x[e]'s
    view = dict(R=n, K=k, KL=k_loaded, s_r=x.stride(2), s_k=x.stride(1), s_b=x.stride(0), r_r=r_r, r_k=r_k)
    common = dict(RHT=rht, SR=seed is not None)
    sliced = x.stride(1) != 1 and not tile2d  # blocks read down a strided dim: the slice kernels
    if fmt is NVFP4:
        amax = torch.zeros(items, device=x.device, dtype=torch.int32)
        views = (x, mt, amax, (n, k_loaded), (x.stride(2), x.stride(1)), x.stride(0))
        if sliced and rht:
            qc.launch_rht_amax(*views)
        else:
            launch_amax(*views, rht)
        codes = torch.empty(items, n, k // 2, device=x.device, dtype=torch.uint8)
        scales = torch.empty((items, n // 16, k // 16) if tile2d else (items, n, k // 16), device=x.device,
                             dtype=torch.uint8)
        s_dec = torch.empty(items, device=x.device, dtype=torch.float32)
        args = (x, mt, step, key, codes, scales, amax, s_dec)
        sizes = view | dict(c_b=codes[0].numel(), sc_b=scales[0].numel())
        if sliced:
            _nvfp4_batch_cols_kernel[grid](*args, **sizes, HW=nvfp4_hardware(x.device), **common)
        else:
            _nvfp4_batch_kernel[grid](*args, **sizes, TILE2D=tile2d, HW=nvfp4_hardware(x.device), **common)
        return codes, scales.view(torch.float8_e4m3fn), s_dec
    elem = fmt.elem
    codes = torch.empty(items, n, k, device=x.device, dtype=torch.uint8)
    scales = torch.empty(items, n, k // 32, device=x.device, dtype=torch.uint8)
    kernel = _mxfp8_batch_cols_kernel if sliced else _mxfp8_batch_kernel
    kernel[grid](x, mt, step, key, codes, scales, **view, c_b=n * k, sc_b=n * (k // 32),
                 **mxfp8_meta(fmt, scale_mode, x.device), **common)
    return codes.view(elem.torch_dtype), scales, None
