"""Triton block-scaled matmul: C = A · Bᵀ over quantized (or BF16) operands stored (rows, K).

One kernel serves both paths: tiles are decoded in-kernel (integer decoding of the codes and block
scales) and multiplied either with an fp32 (IEEE) ``tl.dot`` (this module's ``scaled_mm_triton``) or, cast
exactly to bf16, on tensor cores (``scaled_mm_tc_triton``); both accumulate in fp32, NVFP4 tensor scales
multiply the accumulator, bias is added in fp32 and the output rounded once (RNE, by bit arithmetic for
bfloat16). ``tl.dot_scaled`` is not used: no Blackwell part was available to verify it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..core.launch import cdiv, guarded_grid, interpreting
from ..core.operand import KIND_NVFP4, Operand, kernel_args
from .numerics import decode_e2m1, decode_e8m0, decode_float8, decode_fp8, to_bf16_bits

BLOCK_M = 32
BLOCK_N = 32
BLOCK_K = 64
DOT_FP32, DOT_BF16, DOT_BF16_IN_FP32 = 0, 1, 2  # how tiles are multiplied (the last: the interpreter's bf16)
GROUP_M = tl.constexpr(8)  # output tile rows a band of programs covers (``grouped_tile``)


def bf16_dot() -> int:
    """The tensor-core dot, or in the interpreter (whose dot reads bf16 as integers) the same values in fp32."""
    return DOT_BF16_IN_FP32 if interpreting() else DOT_BF16


@triton.jit
def decode_tile(codes_ptr, scales_ptr, rows, k0, R, K, BK: tl.constexpr,
                KIND: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                HAS_INF: tl.constexpr, TILE_ROWS: tl.constexpr, PER_BLOCK: tl.constexpr, HW: tl.constexpr = False):
    """[len(rows), BK] tile, columns k0 .. k0 + BK, of one operand: quantized ones (0 = NVFP4, 1 = MXFP8) decoded
    to fp32 (``decode_codes``), plain values (2 = BF16, 3 = BF16 with a tensor scale: an NVFP4 operand decoded to
    bf16) loaded as stored, for ``dot_operand`` to cast: a bf16 tile then reaches a bf16 dot as loaded. One
    return: Triton types every return a function has, the branch not compiled included."""
    if KIND >= 2:
        kk = k0 + tl.arange(0, BK)
        tile = tl.load(codes_ptr + rows[:, None] * K + kk[None, :], mask=(rows < R)[:, None] & (kk < K)[None, :],
                       other=0.0)
    else:
        tile = decode_codes(codes_ptr, scales_ptr, rows, k0, R, K, BK, KIND, EBITS, MBITS, BIAS, HAS_INF, TILE_ROWS,
                            PER_BLOCK, HW)
    return tile


@triton.jit
def decode_codes(codes_ptr, scales_ptr, rows, k0, R, K, BK: tl.constexpr,
                 KIND: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                 HAS_INF: tl.constexpr, TILE_ROWS: tl.constexpr, PER_BLOCK: tl.constexpr, HW: tl.constexpr = False):
    """fp32 [len(rows), BK] tile, columns k0 .. k0 + BK, of a quantized operand (0 = NVFP4, 1 = MXFP8): code times
    block scale, exact in fp32; NVFP4's tensor scale is left to the accumulator (``apply_tensor_scales``).
    PER_BLOCK reads each packed byte once and decodes each block scale once, then broadcasts it over its block
    (a third of the sm_90 instructions for NVFP4); without it every element loads and decodes its own scale,
    which needs fewer registers where a tile sits beside a dot (kernels that spill with PER_BLOCK)."""
    BR: tl.constexpr = rows.shape[0]
    rmask = (rows < R)[:, None]
    kk = k0 + tl.arange(0, BK)
    mask = rmask & (kk < K)[None, :]
    BLOCK: tl.constexpr = 16 if KIND == 0 else 32
    if not PER_BLOCK:
        if KIND == 0:
            byte = tl.load(codes_ptr + rows[:, None] * (K // 2) + kk[None, :] // 2, mask=mask, other=0)
            nib = tl.where((kk % 2 == 0)[None, :], byte & 0xF, byte >> 4)
            s = tl.load(scales_ptr + (rows // TILE_ROWS)[:, None] * (K // BLOCK) + kk[None, :] // BLOCK, mask=mask,
                        other=0)
            return decode_e2m1(nib) * decode_float8(s, 4, 3, 7, False)
        c = tl.load(codes_ptr + rows[:, None] * K + kk[None, :], mask=mask, other=0)
        s = tl.load(scales_ptr + rows[:, None] * (K // BLOCK) + kk[None, :] // BLOCK, mask=mask, other=127)
        return decode_float8(c, EBITS, MBITS, BIAS, HAS_INF) * decode_e8m0(s)
    blk = k0 // BLOCK + tl.arange(0, BK // BLOCK)
    smask = rmask & (blk < K // BLOCK)[None, :]
    if KIND == 0:
        kb = k0 // 2 + tl.arange(0, BK // 2)
        byte = tl.load(codes_ptr + rows[:, None] * (K // 2) + kb[None, :], mask=rmask & (kb < K // 2)[None, :],
                       other=0).to(tl.int32)
        vals = tl.reshape(tl.join(decode_e2m1(byte & 0xF), decode_e2m1(byte >> 4)), (BR, BK))  # even k: low nibble
        s = tl.load(scales_ptr + (rows // TILE_ROWS)[:, None] * (K // BLOCK) + blk[None, :], mask=smask, other=0)
        scale = decode_fp8(s, 4, 3, 7, False, HW)
    else:
        vals = decode_fp8(tl.load(codes_ptr + rows[:, None] * K + kk[None, :], mask=mask, other=0), EBITS, MBITS,
                          BIAS, HAS_INF, HW)
        scale = decode_e8m0(tl.load(scales_ptr + rows[:, None] * (K // BLOCK) + blk[None, :], mask=smask, other=127))
    return tl.reshape(tl.reshape(vals, (BR, BK // BLOCK, BLOCK)) * scale[:, :, None], (BR, BK))


@triton.jit
def from_row(codes_ptr, scales_ptr, row0, K, KIND: tl.constexpr, TILE_ROWS: tl.constexpr):
    """``decode_tile``'s codes and scales pointers of an operand moved to its row ``row0`` (a multiple of
    TILE_ROWS), in int64: tiles then index their rows from 0, so no element offset passes 2**31."""
    top = tl.cast(row0, tl.int64)
    if KIND >= 2:
        return codes_ptr + top * K, scales_ptr
    return (codes_ptr + top * (K // 2 if KIND == 0 else K),
            scales_ptr + top // TILE_ROWS * (K // (16 if KIND == 0 else 32)))


@triton.jit
def apply_tensor_scales(acc, a_ts, b_ts, A_KIND: tl.constexpr, B_KIND: tl.constexpr):
    """NVFP4's per-tensor decode scales (kinds 0 and 3), once on the fp32 accumulator."""
    if A_KIND == 0 or A_KIND == 3:
        acc = acc * tl.load(a_ts)
    if B_KIND == 0 or B_KIND == 3:
        acc = acc * tl.load(b_ts)
    return acc


@triton.jit
def dot_operand(tile, DOT: tl.constexpr):
    """A decoded (or loaded) tile as the dot takes it: in fp32, or cast to bf16 for tensor cores (exact: the
    values are bf16 numbers). Cast as soon as a tile is decoded, so two fp32 tiles are never live at once."""
    return tile.to(tl.bfloat16) if DOT != 0 else tile.to(tl.float32)


@triton.jit
def accumulate(acc, a, b, DOT: tl.constexpr):
    """acc + a · bᵀ: an fp32 IEEE dot, a bf16 tensor-core dot, or (the interpreter, whose dot reads bf16
    as integers) the same bf16 values multiplied in fp32."""
    if DOT == 0:
        return acc + tl.dot(a, tl.trans(b), input_precision="ieee")
    if DOT == 2:
        return acc + tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
    return tl.dot(a, tl.trans(b), acc, out_dtype=tl.float32)


@triton.jit
def grouped_tile(pid, M, N, BM: tl.constexpr, BN: tl.constexpr):
    """First row and column of program ``pid``'s output tile, programs ordered GROUP_M tile rows at a time down
    each tile column (a band of A and a tile column of B stay in L2 together), not one whole tile row after
    another."""
    grid_m, grid_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    band = GROUP_M * grid_n
    first_m = pid // band * GROUP_M
    rows = tl.minimum(grid_m - first_m, GROUP_M)
    return (first_m + pid % band % rows) * BM, pid % band // rows * BN


@triton.jit
def scaled_mm_kernel(
    a_codes, a_scales, a_ts, b_codes, b_scales, b_ts, bias_ptr, out_ptr, flag_ptr, M, N, K,
    A_KIND: tl.constexpr, A_EBITS: tl.constexpr, A_MBITS: tl.constexpr, A_BIAS: tl.constexpr, A_INF: tl.constexpr,
    B_KIND: tl.constexpr, B_EBITS: tl.constexpr, B_MBITS: tl.constexpr, B_BIAS: tl.constexpr, B_INF: tl.constexpr,
    B_TILE_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, OUT_BF16: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT: tl.constexpr, GUARDED: tl.constexpr,
):
    """One output tile per program; with GUARDED a persistent grid (``launch.guarded_grid``) whose programs return at
    once while the int32 at ``flag_ptr`` is 0, else stride over all tiles (the flag is set on the device by
    ``scaled_mm_decoded``'s decode when a value was not exact in bf16): a clear flag costs a few programs, not one
    per output tile."""
    if GUARDED:
        if tl.load(flag_ptr) != 0:
            for pid in range(tl.program_id(0), tl.cdiv(M, BM) * tl.cdiv(N, BN), tl.num_programs(0)):
                _product_tile(pid, a_codes, a_scales, a_ts, b_codes, b_scales, b_ts, bias_ptr, out_ptr, M, N, K,
                              A_KIND, A_EBITS, A_MBITS, A_BIAS, A_INF, B_KIND, B_EBITS, B_MBITS, B_BIAS, B_INF,
                              B_TILE_ROWS, HAS_BIAS, OUT_BF16, BM, BN, BK, DOT)
    else:
        _product_tile(tl.program_id(0), a_codes, a_scales, a_ts, b_codes, b_scales, b_ts, bias_ptr, out_ptr, M, N, K,
                      A_KIND, A_EBITS, A_MBITS, A_BIAS, A_INF, B_KIND, B_EBITS, B_MBITS, B_BIAS, B_INF, B_TILE_ROWS,
                      HAS_BIAS, OUT_BF16, BM, BN, BK, DOT)


@triton.jit
def _product_tile(
    pid, a_codes, a_scales, a_ts, b_codes, b_scales, b_ts, bias_ptr, out_ptr, M, N, K,
    A_KIND: tl.constexpr, A_EBITS: tl.constexpr, A_MBITS: tl.constexpr, A_BIAS: tl.constexpr, A_INF: tl.constexpr,
    B_KIND: tl.constexpr, B_EBITS: tl.constexpr, B_MBITS: tl.constexpr, B_BIAS: tl.constexpr, B_INF: tl.constexpr,
    B_TILE_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, OUT_BF16: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT: tl.constexpr,
):
    """Output tile ``pid`` (``grouped_tile``'s order) of the product."""
    m0, n0 = grouped_tile(pid, M, N, BM, BN)
    ac, asc = from_row(a_codes, a_scales, m0, K, A_KIND, 1)  # tiles index their rows from 0
    bc, bsc = from_row(b_codes, b_scales, n0, K, B_KIND, B_TILE_ROWS)
    local_m, local_n = tl.arange(0, BM), tl.arange(0, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):  # NVFP4 tiles for tensor cores (DOT not 0, FP32) decode per block: no spills
        a = dot_operand(decode_tile(ac, asc, local_m, k0, M - m0, K, BK, A_KIND, A_EBITS, A_MBITS, A_BIAS,
                                    A_INF, 1, DOT != 0 and A_KIND == 0), DOT)
        b = dot_operand(decode_tile(bc, bsc, local_n, k0, N - n0, K, BK, B_KIND, B_EBITS, B_MBITS, B_BIAS,
                                    B_INF, B_TILE_ROWS, DOT != 0 and B_KIND == 0), DOT)
        acc = accumulate(acc, a, b, DOT)
    acc = apply_tensor_scales(acc, a_ts, b_ts, A_KIND, B_KIND)
    # from the tile's first row in int64: an (M, N) output (logits) may pass 2**31 elements
    store_tile(acc, bias_ptr, out_ptr + tl.cast(m0, tl.int64) * N, local_m, n0 + local_n, M - m0, N, HAS_BIAS,
               OUT_BF16)


@triton.jit
def store_tile(acc, bias_ptr, out_ptr, rm, rn, M, N, HAS_BIAS: tl.constexpr, OUT_BF16: tl.constexpr):
    """The epilogue: bias added in fp32, one rounding to the output dtype (bf16 by bit arithmetic)."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    ptrs = out_ptr + rm[:, None] * N + rn[None, :]
    if OUT_BF16:
        tl.store(ptrs, to_bf16_bits(acc), mask=mask)
    else:
        tl.store(ptrs, acc, mask=mask)


def launch(blocks: tuple[int, int, int], a: Operand, b: Operand, bias: torch.Tensor | None,
           out_dtype: torch.dtype, dot: int, *, out: torch.Tensor | None = None, flag: torch.Tensor | None = None,
           **options) -> torch.Tensor:
    """Run the block-scaled matmul kernel: (M, K) · (N, K)ᵀ -> (M, N) in ``out_dtype`` (float32 or
    bfloat16), operands already checked; ``blocks`` is (BM, BN, BK), ``dot`` one of the DOT_* modes,
    ``options`` Triton's launch options (num_warps, num_stages). Given ``flag`` (an int32 device scalar),
    the product is written into ``out`` only where the flag is not 0 when the kernel runs."""
    m, k, n = a.rows, a.k, b.rows
    out = torch.empty(m, n, device=a.codes.device, dtype=out_dtype) if out is None else out
    a_ptrs, a_meta = kernel_args(a)
    b_ptrs, b_meta = kernel_args(b)
    out_arg = out.view(torch.int16) if out_dtype == torch.bfloat16 else out
    bm, bn, bk = blocks
    scaled_mm_kernel[guarded_grid((cdiv(m, bm) * cdiv(n, bn),), flag, out.device)](
        *a_ptrs, *b_ptrs, bias if bias is not None else out, out_arg, flag if flag is not None else out, m, n, k,
        *a_meta, *b_meta, b.tile_rows if b.kind == KIND_NVFP4 else 1,
        HAS_BIAS=bias is not None, OUT_BF16=out_dtype == torch.bfloat16, BM=bm, BN=bn, BK=bk, DOT=dot,
        GUARDED=flag is not None, **options,
    )
    return out


def scaled_mm_triton(a: Operand, b: Operand, bias: torch.Tensor | None, out_dtype: torch.dtype, *,
                     out: torch.Tensor | None = None, flag: torch.Tensor | None = None) -> torch.Tensor:
    """(M, K) · (N, K)ᵀ -> (M, N) with tiles decoded to fp32 and an fp32 (IEEE) dot; ``out`` and ``flag`` as
    ``launch`` takes them (a product written in place only where a device flag is set)."""
    return launch((BLOCK_M, BLOCK_N, BLOCK_K), a, b, bias, out_dtype, DOT_FP32, out=out, flag=flag)
