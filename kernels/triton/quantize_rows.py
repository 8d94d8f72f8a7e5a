"""Triton NVFP4 and MXFP8 quantizers (RNE or SR, rows or columns, optional fused RHT).

The input is read through its strides as a 2D (R, K) matrix whose K is the block axis, so quantizing
``x`` along dim 0 (the transposed copy wgrad needs) reads ``x`` in place; nothing is transposed in high
precision. Outputs are laid out like the reference's (block axis last) and match it byte for byte. The tile
kernels here quantize rows (K the unit-stride dim) and 16x16 tiles; ``quantize.quantize_triton`` hands blocks read
down a strided dim to the slice kernels of ``quantize_cols``.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from autoprec.formats import NVFP4, Format

from ..core.launch import cdiv, hardware_fp8, nvfp4_hardware
from ..core.random_bits import StepStream, stream_keys
from ..reference.hadamard import rht_signs
from .autotune import autotune, fixed_tile
from .block_scales import (
    INF_BITS,
    atomic_max_bits,
    e4m3_codes,
    mxfp8_block_exponents,
    nvfp4_block_scales,
)
from .numerics import (
    e2m1_pair,
    pow2,
    round_and_encode,
    round_and_encode_fp8,
    sr_hash_bits,
    step_stream_keys,
)
from .slices import join_slices, load_slices

BLOCK_R = 16  # the first config of the quantize kernels
BLOCK_K = 64
AMAX_TILE = {"BR": 64, "BK": BLOCK_K}  # the amax passes' tile on a GPU (4 warps: 32 elements per thread) ...
AMAX_PROGRAMS = 1024  # ... and it runs at most this many programs, each looping over tiles
# (BR, BK, warps) the quantize kernels are autotuned over on a GPU (tests/ptx_report.py compiles every config
# and checks registers). The first three give each thread 8 elements; the last three 32, which spreads each
# program's fixed work (indices, the tensor scales' divisions) over 4x the elements: 33 sm_90 instructions
# per element instead of 54 for the NVFP4 row quantizer. Not yet timed or checked on a GPU
# (tests/test_gpu_quantize.py forces every config against the reference), so strided reads (16x16 tiles of a
# column copy) leave them out until one has (``_strided_reads_keep_checked_tiles``). The key holds the block
# axis's stride, so a square tensor's rows and columns are tuned apart.
CONFIGS = [triton.Config({"BR": br, "BK": bk}, num_warps=w) for br, bk, w in (
    (BLOCK_R, BLOCK_K, 4), (32, 64, 8), (16, 128, 8), (64, 64, 4), (32, 128, 4), (128, 64, 8))]
GPU_CHECKED = CONFIGS[:3]  # the tiles a GPU has run against the reference (MXFP8 drops the first, below)
# The interpreter's tile, for the quantize kernels and the amax passes: no GPU's registers bound it, and the
# interpreter's cost is per program and per op, so large tiles run the tests several times faster. Tests force each
# GPU tile against the reference (``test_every_autotuned_tile_matches_reference`` and its kin).
INTERPRETER_TILE = triton.Config({"BR": 128, "BK": 128}, num_warps=8)


def _strided_reads_keep_checked_tiles(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """The autotuner's pruning: blocks read down a strided dim (``s_k`` is not 1: a column copy in 16x16 tiles,
    the one these kernels still take) tune only over tiles a GPU has checked. The wrong tile a GPU showed
    (below) was wrong for strided reads alone, and the one-read kernel's wrong copy was a strided one too; rows
    tune over every tile. The interpreter's own tile (exact there, never launched on a GPU) stays."""
    return configs if named_args["s_k"] == 1 or configs == [INTERPRETER_TILE] else [c for c in configs
                                                                                   if c in GPU_CHECKED]


# On a GPU (Triton 3.6) the MXFP8 kernel at the first tile wrote wrong scales for blocks read down a strided
# dim (blocks along dim 0, or a transposed view) while the other two tiles were exact on the same inputs; the
# interpreter is exact at every tile. The cause is not known, so on a GPU the MXFP8 kernel is tuned over the tiles
# that were exact there (it reads rows alone now: column copies go to the slice kernels).
MXFP8_GPU_CONFIGS = CONFIGS[1:]
# The SR stream's keys travel as scalar kernel arguments, not as a tensor: a tensor made from host ints is a
# host-to-device copy, which waits for the GPU. Not specialized: every quantization has new keys.
KEY_ARGS = ["k1", "k2"]


@triton.jit
def _load_tile(x_ptr, m_ptr, rows, col0, R, K, s_r, s_k, BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr):
    """A [BR, BK/16, 16] fp32 tile of the (R, K) view; with RHT each 16-group is multiplied by
    H16·diag(signs)/4 (``m_ptr``: the 16 signs) in the reference's order (``slices.load_slices``' RHT, on
    the tile's 16 slices, then joined)."""
    nb = tl.arange(0, BK // 16)
    if RHT:
        return join_slices(load_slices(x_ptr, m_ptr, rows, col0 + nb * 16, R, K, s_r, s_k, 16, True), 16)
    cols = col0 + nb[:, None] * 16 + tl.arange(0, 16)[None, :]
    mask = (rows < R)[:, None, None] & (cols < K)[None, :, :]
    r64 = rows.to(tl.int64)  # element offsets in int64: a tensor (or a strided view) may span 2**31 elements
    ptrs = x_ptr + r64[:, None, None] * s_r + cols.to(tl.int64)[None, :, :] * s_k
    return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _load_rand(rand_ptr, k1, k2, rows, col0, R, K, s_r, s_k, BR: tl.constexpr, BK: tl.constexpr,
               HASH: tl.constexpr):
    """SR bits of a [BR, BK/16, 16] tile: with HASH computed from the stream's keys and each element's
    row-major index in the tensor (``s_r``, ``s_k``: the index strides of the (R, K) view), else (HASH 0) loaded
    from ``rand_ptr``. HASH 1: the keys are ``k1``, ``k2`` (int32 scalars holding the uint32 bits); HASH 2: the
    stream is a ``StepStream``, ``k1`` holds mix32 of its seed and ``rand_ptr`` points at its step."""
    cols = col0 + tl.arange(0, BK // 16)[:, None] * 16 + tl.arange(0, 16)[None, :]
    if HASH:  # one return: the other branch (not compiled) may see a rand_ptr of another type
        idx = rows.to(tl.int64)[:, None, None] * s_r + cols.to(tl.int64)[None, :, :] * s_k
        a, b = k1.to(tl.uint32, bitcast=True), k2.to(tl.uint32, bitcast=True)
        if HASH == 2:
            a, b = step_stream_keys(a, rand_ptr)
        bits = sr_hash_bits(idx, a, b)
    else:
        mask = (rows < R)[:, None, None] & (cols < K)[None, :, :]
        idx = rows.to(tl.int64)[:, None, None] * s_r + cols.to(tl.int64)[None, :, :] * s_k
        bits = tl.load(rand_ptr + idx, mask=mask, other=0)
    return bits


@triton.jit
def _amax_kernel(x_ptr, m_ptr, amax_ptr, R, K, s_r, s_k, s_b, BR: tl.constexpr, BK: tl.constexpr,
                 RHT: tl.constexpr):
    """max|x| over the finite values, into the int32 at ``amax_ptr`` (zeroed first) by ``atomic_max_bits``; with a
    second grid axis, of each batch item ``program_id(1)`` (``s_b`` elements apart) into ``amax_ptr[item]``.
    Program p folds tiles p, p + programs, ... (row-major over the tile grid) into one atomic: atomics on one
    address serialize, so a launch makes at most ``AMAX_PROGRAMS`` of them per item, not one per tile."""
    item = tl.program_id(1)
    x_ptr += item.to(tl.int64) * s_b
    n_k = tl.cdiv(K, BK)
    amax = 0.0
    for t in range(tl.program_id(0), tl.cdiv(R, BR) * n_k, tl.num_programs(0)):
        amax = tl.maximum(amax, tile_amax(x_ptr, m_ptr, R, K, s_r, s_k, t // n_k, t % n_k, BR, BK, RHT))
    atomic_max_bits(amax_ptr + item, amax)


@triton.jit
def tile_amax(x_ptr, m_ptr, R, K, s_r, s_k, pid_r, pid_k, BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr):
    """max|x| over the finite values of tile (``pid_r``, ``pid_k``), transformed along K with RHT."""
    rows = pid_r * BR + tl.arange(0, BR)
    a = tl.abs(_load_tile(x_ptr, m_ptr, rows, pid_k * BK, R, K, s_r, s_k, BR, BK, RHT))
    return tl.max(tl.max(tl.max(tl.where(a < float("inf"), a, 0.0), 2), 1), 0)


@autotune(CONFIGS, INTERPRETER_TILE, ["R", "K", "s_k", "RHT", "SR", "TILE2D"],
                 prune_configs_by={"early_config_prune": _strided_reads_keep_checked_tiles})
@triton.jit(do_not_specialize=KEY_ARGS)
def _nvfp4_kernel(x_ptr, m_ptr, rand_ptr, k1, k2, codes_ptr, scales_ptr, amax_ptr, ts_ptr,
                  R, K, s_r, s_k, r_r, r_k,
                  BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr, SR: tl.constexpr, HASH: tl.constexpr,
                  TILE2D: tl.constexpr, HW: tl.constexpr):
    nvfp4_tile(x_ptr, m_ptr, rand_ptr, k1, k2, codes_ptr, scales_ptr, amax_ptr, ts_ptr, R, K, s_r, s_k,
               r_r, r_k, tl.program_id(0), tl.program_id(1), BR, BK, RHT, SR, HASH, TILE2D, HW)


@triton.jit
def nvfp4_tile(x_ptr, m_ptr, rand_ptr, k1, k2, codes_ptr, scales_ptr, amax_ptr, ts_ptr,
               R, K, s_r, s_k, r_r, r_k, pid_r, pid_k,
               BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr, SR: tl.constexpr, HASH: tl.constexpr,
               TILE2D: tl.constexpr, HW: tl.constexpr):
    """Quantizes tile (``pid_r``, ``pid_k``) of BR x BK of the (R, K) view to NVFP4 along K, with the tensor
    scales of the amax bits at ``amax_ptr``; tile (0, 0) writes the tensor's decode scale to ``ts_ptr``."""
    rows = pid_r * BR + tl.arange(0, BR)
    col0 = pid_k * BK
    y = _load_tile(x_ptr, m_ptr, rows, col0, R, K, s_r, s_k, BR, BK, RHT)
    nvfp4_encode_store(y, amax_ptr, 0, ts_ptr, pid_r == 0 and pid_k == 0, rand_ptr, k1, k2, rows, col0, r_r, r_k,
                       codes_ptr, scales_ptr, rows, col0, R, K, pid_r, BR, BK, SR, HASH, TILE2D, False, HW)


@triton.jit
def nvfp4_encode_store(y, amax_ptr, amax_idx, ts_ptr, first, rand_ptr, k1, k2, sr_rows, sr_col0, r_r, r_k, codes_ptr,
                       scales_ptr, rows, col0, R, K, pid_r, BR: tl.constexpr, BK: tl.constexpr, SR: tl.constexpr,
                       HASH: tl.constexpr, TILE2D: tl.constexpr, GROUPED: tl.constexpr, HW: tl.constexpr):
    """NVFP4 codes and block scales of the [BR, BK/16, 16] fp32 tile ``y`` (rows ``rows``, columns from ``col0``),
    stored at ``codes_ptr`` and ``scales_ptr``, under the tensor scales of the amax bits at ``amax_ptr +
    amax_idx``: one tensor's or batch item's (a scalar ``amax_idx``; the ``first`` tile writes its decode scale
    to ``ts_ptr``), or with GROUPED each row's group's (``amax_idx`` [BR, 1]). The decode scale is stored here,
    right after it is computed: stored after the codes, it stays live across them and the wide tiles spill
    (tests/ptx_report.py). With SR, the bits are ``_load_rand``'s for rows ``sr_rows``, made where they are
    used (made earlier, they stay live across the scales and spill), indexed from column ``sr_col0``. HW is
    ``launch.nvfp4_hardware``'s level: the GPU's conversions for the block scales (1) and the elements too (2)."""
    NB: tl.constexpr = BK // 16
    # |y|'s bits order as |y| does, NaN and Inf above every finite value: one integer max gives the block amax,
    # or a non-finite one, which makes the whole block NaN (its finite amax is not needed then)
    amax_bits = tl.max(y.to(tl.int32, bitcast=True) & 0x7FFFFFFF, 2)
    if TILE2D:
        amax_bits = tl.max(tl.reshape(amax_bits, (BR // 16, 16, NB)), 1)
    s_b, e_b = nvfp4_block_scales(amax_bits, amax_ptr, amax_idx, ts_ptr, first, GROUPED, HW >= 1)

    nb = tl.arange(0, NB)
    if TILE2D:
        srows = pid_r * (BR // 16) + tl.arange(0, BR // 16)
        smask = (srows < R // 16)[:, None] & (col0 // 16 + nb < K // 16)[None, :]
        tl.store(scales_ptr + srows.to(tl.int64)[:, None] * (K // 16) + col0 // 16 + nb[None, :],
                 e4m3_codes(s_b, HW >= 1), mask=smask)
        e_b = tl.reshape(tl.broadcast_to(e_b[:, None, :], (BR // 16, 16, NB)), (BR, NB))
    else:
        smask = (rows < R)[:, None] & (col0 // 16 + nb < K // 16)[None, :]
        tl.store(scales_ptr + rows.to(tl.int64)[:, None] * (K // 16) + col0 // 16 + nb[None, :],
                 e4m3_codes(s_b, HW >= 1), mask=smask)

    rand = 0
    if SR:
        rand = _load_rand(rand_ptr, k1, k2, sr_rows, sr_col0, R, K, r_r, r_k, BR, BK, HASH)
    # the GPU's conversion takes a pair at a time; the integer path encodes the whole tile before splitting it, as
    # it did before the conversion (splitting first, through e2m1_pair, moved the SR kernels' registers and
    # instruction counts both ways in tests/ptx_report.py: 48 -> 163 registers for one column tile kernel). A
    # non-finite block's codes are zeroed by its test, not each element's (e2m1_pair's rule: its scaled values are
    # all NaN, whose code is +0); masking its bytes instead made the tile kernels' layouts costlier.
    bad = (e_b != e_b)[:, :, None]
    if HW == 2 and not SR:
        z = tl.where(bad, 0.0, y * e_b[:, :, None])
        packed = e2m1_pair(*tl.split(tl.reshape(z, (BR, BK // 2, 2))), 0, 0, False, SR, True).to(tl.uint8)
    else:
        codes = tl.where(bad, 0, round_and_encode(y * e_b[:, :, None], rand, 2, 1, 0, 6.0, SR, -1))  # E2M1
        lo, hi = tl.split(tl.reshape(codes, (BR, BK // 2, 2)))
        packed = (lo | (hi << 4)).to(tl.uint8)
    pcols = col0 // 2 + tl.arange(0, BK // 2)
    pmask = (rows < R)[:, None] & (pcols < K // 2)[None, :]
    tl.store(codes_ptr + rows.to(tl.int64)[:, None] * (K // 2) + pcols[None, :], packed, mask=pmask)


@autotune(MXFP8_GPU_CONFIGS, INTERPRETER_TILE, ["R", "K", "s_k", "RHT", "SR"],
                 prune_configs_by={"early_config_prune": _strided_reads_keep_checked_tiles})
@triton.jit(do_not_specialize=KEY_ARGS)
def _mxfp8_kernel(x_ptr, m_ptr, rand_ptr, k1, k2, codes_ptr, scales_ptr, R, K, s_r, s_k, r_r, r_k,
                  EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, EMAX: tl.constexpr,
                  MAX: tl.constexpr, FLOOR: tl.constexpr, HW: tl.constexpr,
                  BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr, SR: tl.constexpr, HASH: tl.constexpr):
    mxfp8_tile(x_ptr, m_ptr, rand_ptr, k1, k2, codes_ptr, scales_ptr, R, K, s_r, s_k, r_r, r_k,
               tl.program_id(0), tl.program_id(1), EBITS, MBITS, BIAS, EMAX, MAX, FLOOR, HW, BR, BK, RHT, SR, HASH)


@triton.jit
def mxfp8_tile(x_ptr, m_ptr, rand_ptr, k1, k2, codes_ptr, scales_ptr, R, K, s_r, s_k, r_r, r_k, pid_r, pid_k,
               EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, EMAX: tl.constexpr,
               MAX: tl.constexpr, FLOOR: tl.constexpr, HW: tl.constexpr,
               BR: tl.constexpr, BK: tl.constexpr, RHT: tl.constexpr, SR: tl.constexpr, HASH: tl.constexpr):
    """Quantizes tile (``pid_r``, ``pid_k``) of BR x BK of the (R, K) view to MXFP8 along K."""
    rows = pid_r * BR + tl.arange(0, BR)
    col0 = pid_k * BK
    y = _load_tile(x_ptr, m_ptr, rows, col0, R, K, s_r, s_k, BR, BK, RHT)
    mxfp8_encode_store(y, rand_ptr, k1, k2, rows, col0, r_r, r_k, codes_ptr, scales_ptr, rows, col0, R, K, EBITS, MBITS,
                       BIAS, EMAX, MAX, FLOOR, HW, BR, BK, SR, HASH)


@triton.jit
def mxfp8_encode_store(y, rand_ptr, k1, k2, sr_rows, sr_col0, r_r, r_k, codes_ptr, scales_ptr, rows, col0, R, K,
                       EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, EMAX: tl.constexpr,
                       MAX: tl.constexpr, FLOOR: tl.constexpr, HW: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
                       SR: tl.constexpr, HASH: tl.constexpr):
    """MXFP8 codes and E8M0 block scales of the [BR, BK/16, 16] fp32 tile ``y`` (rows ``rows``, columns from
    ``col0``), stored at ``codes_ptr`` and ``scales_ptr``; SR bits as ``nvfp4_encode_store`` makes them."""
    NB: tl.constexpr = BK // 32
    y = tl.reshape(y, (BR, NB, 32))
    abs_bits = y.to(tl.int32, bitcast=True) & 0x7FFFFFFF  # ordered as |y|; Inf and NaN at INF_BITS and above
    amax = tl.max(tl.where(abs_bits < INF_BITS, abs_bits, 0), 2).to(tl.float32, bitcast=True)  # finite values
    bad = tl.max(abs_bits, 2) >= INF_BITS
    e = mxfp8_block_exponents(amax, EMAX, MAX, FLOOR)

    nb = tl.arange(0, NB)
    smask = (rows < R)[:, None] & (col0 // 32 + nb < K // 32)[None, :]
    scale_codes = tl.where(bad, 255, e + 127).to(tl.uint8)
    tl.store(scales_ptr + rows.to(tl.int64)[:, None] * (K // 32) + col0 // 32 + nb[None, :], scale_codes, mask=smask)

    rand = 0
    if SR:
        rand = tl.reshape(_load_rand(rand_ptr, k1, k2, sr_rows, sr_col0, R, K, r_r, r_k, BR, BK, HASH), (BR, NB, 32))
    codes = round_and_encode_fp8(y * pow2(-e)[:, :, None], rand, EBITS, MBITS, BIAS, MAX, SR, HW)
    codes = tl.reshape(codes.to(tl.uint8), (BR, BK))
    cols = col0 + tl.arange(0, BK)
    cmask = (rows < R)[:, None] & (cols < K)[None, :]
    tl.store(codes_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], codes, mask=cmask)


def as_matrix(x: torch.Tensor, axis: int) -> torch.Tensor:
    """A 2D (R, K) view with K = ``axis``, a strided view for 2D inputs (no copy)."""
    if x.ndim == 2:
        return x if axis == 1 else x.t()
    return x.movedim(axis, -1).reshape(-1, x.shape[axis])


@functools.lru_cache(maxsize=4096)
def index_strides(shape: torch.Size, axis: int) -> tuple[int, int] | None:
    """Strides, in row-major element indices of ``shape``, of the (R, K) view ``as_matrix`` takes; None
    where that view is not a strided one (a 3D tensor blocked along a middle dim). Cached: a model quantizes
    the same few shapes on every step."""
    meta = torch.empty(shape, device="meta")
    try:
        return tuple(meta.movedim(axis, -1).view(-1, shape[axis]).stride()) if meta.ndim > 2 else \
            as_matrix(meta, axis).stride()
    except RuntimeError:
        return None


def kernel_keys(stream: int | StepStream | None) -> tuple[int, int]:
    """The kernels' ``k1``, ``k2`` of an SR stream as int32 arguments holding uint32 bits: the stream's two keys;
    for a ``StepStream``, mix32 of its seed (the kernel derives the keys with its step); 0, 0 without SR."""
    if stream is None:
        return 0, 0
    keys = (stream.seed_key(), 0) if isinstance(stream, StepStream) else stream_keys(stream)
    return tuple(int32_arg(k) for k in keys)


def hashed_stream(stream: int | StepStream, unused: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(HASH, rand_ptr) of a kernel hashing the SR bits of ``stream``: 2 and its step for a ``StepStream`` (the
    kernel reads the step and derives the keys on the device), else 1 and ``unused`` (a pointer it never reads)."""
    return (2, stream.step) if isinstance(stream, StepStream) else (1, unused)


def int32_arg(bits: int) -> int:
    """The int32 kernel argument holding the uint32 ``bits``."""
    return bits - (1 << 32) if bits >= 1 << 31 else bits


_RHT_SIGNS: dict[tuple[tuple[float, ...], torch.device], torch.Tensor] = {}


def rht_operand(x: torch.Tensor, rht: bool, signs: torch.Tensor | None) -> torch.Tensor:
    """The kernels' RHT operand, the 16 fp32 signs (H16 itself is built into the kernels), on ``x``'s device,
    copied there once per sign vector (each copy from the host waits for the GPU); without the RHT, ``x``
    itself, a pointer the kernels do not read."""
    if not rht:
        return x
    signs = rht_signs() if signs is None else signs
    key = (tuple(signs.cpu().tolist()), x.device)
    if key not in _RHT_SIGNS:
        _RHT_SIGNS[key] = torch.tensor(key[0], dtype=torch.float32, device=x.device)
    return _RHT_SIGNS[key]


def quantize_rows(fmt: Format, args: tuple, s_dec: torch.Tensor | None, r_strides: tuple[int, int], scale_mode: str,
                  common: dict, amax: torch.Tensor | None, tile2d: bool) -> None:
    """Launches the row kernel on ``args`` (``quantize.quantize_triton``'s): blocks along the matrix's contiguous
    dim, or 16x16 tiles; NVFP4's amax pass first unless ``amax`` is given."""
    m, mt = args[0], args[1]
    if fmt is NVFP4:
        amax = nvfp4_amax(m, mt, common["RHT"]) if amax is None else amax
        _nvfp4_kernel[tile_grid(m)](*args, amax, s_dec, *m.shape, *m.stride(), *r_strides,
                                TILE2D=tile2d, HW=nvfp4_hardware(m.device), **common)
    else:
        _mxfp8_kernel[tile_grid(m)](*args, *m.shape, *m.stride(), *r_strides, **mxfp8_meta(fmt, scale_mode, m.device),
                                **common)


def tile_grid(m: torch.Tensor):
    """The launch grid of a quantizer tiling the (R, K) matrix ``m`` in BR x BK tiles."""
    return lambda meta: (cdiv(m.shape[0], meta["BR"]), cdiv(m.shape[1], meta["BK"]))


def nvfp4_amax(m: torch.Tensor, mt: torch.Tensor, rht: bool) -> torch.Tensor:
    """The int32 cell holding the fp32 bits of max|m| (with ``rht``: of the RHT along K; ``mt`` its signs) over the
    finite values: NVFP4's tensor amax, the quantize kernels' ``amax_ptr``."""
    amax = torch.zeros((), device=m.device, dtype=torch.int32)
    launch_amax(m, mt, amax, m.shape, m.stride(), 0, rht)
    return amax


def launch_amax(x: torch.Tensor, mt: torch.Tensor, amax: torch.Tensor, shape: tuple[int, int],
                strides: tuple[int, int], s_b: int, rht: bool) -> None:
    """Launch ``_amax_kernel`` over the (R, K) views (``shape``, ``strides``) of ``amax.numel()`` batch items of
    ``x``, ``s_b`` apart: each item's max|x| bits (with ``rht``: of the RHT along K) into its int32 ``amax`` cell
    (zeroed)."""
    tile = fixed_tile(AMAX_TILE, INTERPRETER_TILE)
    tiles = cdiv(shape[0], tile["BR"]) * cdiv(shape[1], tile["BK"])
    _amax_kernel[(min(tiles, AMAX_PROGRAMS), amax.numel())](x, mt, amax, *shape, *strides, s_b, RHT=rht, **tile)


def mxfp8_meta(fmt: Format, scale_mode: str, device: torch.device) -> dict:
    """The MXFP8 kernels' format constexprs, and HW: whether ``device`` rounds RNE with its fp8 conversion."""
    elem = fmt.elem
    return dict(EBITS=elem.ebits, MBITS=elem.mbits, BIAS=elem.bias, EMAX=elem.emax, MAX=elem.max,
                FLOOR=scale_mode == "floor", HW=hardware_fp8(device))
