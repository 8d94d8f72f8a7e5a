"""Block-scaled matmul as two library-grade steps, for GPUs without block-scaled MMA (sm_90): both operands
decoded to bf16 in memory by one Triton launch (``code · block scale``, exact for NVFP4 and for MXFP8 scale
exponents away from E8M0's ends; where a value is not a bf16 normal the kernel sets a device flag, and the
fp32 Triton kernel recomputes the product in place), then a bf16 tensor-core GEMM accumulating in fp32, and
NVFP4's tensor scales, the bias and one rounding to the output dtype applied to that accumulator, in the
reference's order. It equals the reference up to fp32 accumulation order.

The GEMM is one of two products, each GEMM key measured once on the GPU (``gemm_choice``): cuBLAS's
(``torch.mm(..., out_dtype=torch.float32)``, then one Triton pass for the epilogue: a write and a read of the fp32
product next to the GEMM; MXFP8 to bf16, without bias or with a bf16 one, skips that pass, cuBLAS rounding its fp32
accumulator plus the bias once, with torch's ``allow_bf16_reduced_precision_reduction`` turned off around the call:
torch's default lets cuBLAS add split-K partial sums in bf16, which the reference's fp32 accumulation does not), or
Triton's (``scaled_mm_triton``'s kernel reading the bf16 tiles as stored, the epilogue in its registers: no fp32
product in memory). ``scaled_mm_decoded_cublas`` and ``scaled_mm_decoded_triton`` run one of them;
``scaled_mm_decoded_tma`` runs a third, Triton's GEMM with its tiles copied by the TMA (``decoded_gemm_tma``), which
the benchmark times beside them.
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from ..core.launch import cdiv, hardware_fp8, interpreting
from ..core.operand import KIND_BF16, KIND_MXFP8, KIND_NVFP4, Operand, decoded, kernel_args
from .decoded_gemm_tma import TMA_BLOCKS, TMA_STAGES, TMA_WARPS, tma_gemm
from .gemm_choice import choose, size_bucket
from .scaled_mm import (
    apply_tensor_scales,
    bf16_dot,
    decode_tile,
    from_row,
    launch,
    scaled_mm_triton,
    store_tile,
)

DECODE_R, DECODE_K = 64, 64
EPILOGUE_M, EPILOGUE_N = 32, 128
GEMM_BLOCKS, GEMM_WARPS, GEMM_STAGES = (128, 128, 64), 8, 3  # the Triton GEMM over decoded operands


@triton.jit
def _decode_kernel(a_codes, a_scales, a_out, b_codes, b_scales, b_out, flag_ptr, RA, RB, K, TILES_A,
                   A_KIND: tl.constexpr, A_EBITS: tl.constexpr, A_MBITS: tl.constexpr, A_BIAS: tl.constexpr,
                   A_HAS_INF: tl.constexpr, A_TILE_ROWS: tl.constexpr, A_CHECK: tl.constexpr,
                   B_KIND: tl.constexpr, B_EBITS: tl.constexpr, B_MBITS: tl.constexpr, B_BIAS: tl.constexpr,
                   B_HAS_INF: tl.constexpr, B_TILE_ROWS: tl.constexpr, B_CHECK: tl.constexpr,
                   BR: tl.constexpr, BK: tl.constexpr, IN_FP32: tl.constexpr, HW: tl.constexpr):
    """Both operands of a product decoded in one launch: programs below TILES_A decode row tile
    ``program_id(0)`` of A (RA rows), the others row tile ``program_id(0) - TILES_A`` of B (RB rows); K is
    theirs. One launch fewer per product than a launch per operand (a GPU step's host pays for each)."""
    t = tl.program_id(0)
    SAME: tl.constexpr = (A_KIND == B_KIND and A_EBITS == B_EBITS and A_MBITS == B_MBITS and A_BIAS == B_BIAS
                          and A_HAS_INF == B_HAS_INF and A_TILE_ROWS == B_TILE_ROWS and A_CHECK == B_CHECK)
    if SAME:
        first = t < TILES_A
        _decode_rows(tl.where(first, a_codes, b_codes), tl.where(first, a_scales, b_scales),
                     tl.where(first, a_out, b_out), flag_ptr, tl.where(first, t, t - TILES_A),
                     tl.where(first, RA, RB), K, A_KIND, A_EBITS, A_MBITS, A_BIAS, A_HAS_INF, A_TILE_ROWS, BR, BK,
                     IN_FP32, A_CHECK, HW)
    elif t < TILES_A:
        _decode_rows(a_codes, a_scales, a_out, flag_ptr, t, RA, K, A_KIND, A_EBITS, A_MBITS, A_BIAS, A_HAS_INF,
                     A_TILE_ROWS, BR, BK, IN_FP32, A_CHECK, HW)
    else:
        _decode_rows(b_codes, b_scales, b_out, flag_ptr, t - TILES_A, RB, K, B_KIND, B_EBITS, B_MBITS, B_BIAS,
                     B_HAS_INF, B_TILE_ROWS, BR, BK, IN_FP32, B_CHECK, HW)


@triton.jit
def _decode_rows(codes_ptr, scales_ptr, out_ptr, flag_ptr, tile, R, K,
                 KIND: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                 HAS_INF: tl.constexpr, TILE_ROWS: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
                 IN_FP32: tl.constexpr, CHECK: tl.constexpr, HW: tl.constexpr):
    """bf16 ``code · block scale`` of the (BR, BK) tile (row tile ``tile``, column tile ``program_id(1)``; BR a
    multiple of TILE_ROWS) of one operand; with CHECK, sets the int32 at ``flag_ptr`` to 1 when a value of the tile
    is not a bf16 normal number or zero (its low 16 bits set, or an fp32 subnormal; NaN decodes to NaN either
    way)."""
    top = tile * BR  # pointers from the tile's first row: a stack of experts' weights passes 2**31
    codes_ptr, scales_ptr = from_row(codes_ptr, scales_ptr, top, K, KIND, TILE_ROWS)
    out_ptr += tl.cast(top, tl.int64) * K
    R -= top
    rows = tl.arange(0, BR)
    kk = tl.program_id(1) * BK + tl.arange(0, BK)
    tile = decode_tile(codes_ptr, scales_ptr, rows, tl.program_id(1) * BK, R, K, BK, KIND, EBITS, MBITS, BIAS,
                       HAS_INF, TILE_ROWS, True, HW)
    mask = (rows < R)[:, None] & (kk < K)[None, :]
    if CHECK:
        bits = tile.to(tl.int32, bitcast=True)
        mag = bits & 0x7FFFFFFF
        inexact = (tile == tile) & (mag != 0) & (((bits & 0xFFFF) != 0) | (mag < 0x00800000))
        if tl.max(tl.max(inexact.to(tl.int32), 1), 0) != 0:
            tl.store(flag_ptr, 1)
    if IN_FP32:  # the interpreter's float casts round wrongly: keep fp32, the caller casts (exact either way)
        tl.store(out_ptr + rows[:, None] * K + kk[None, :], tile, mask=mask)
    else:
        tl.store(out_ptr + rows[:, None] * K + kk[None, :], tile.to(tl.bfloat16), mask=mask)


@triton.jit
def _epilogue_kernel(acc_ptr, a_ts, b_ts, bias_ptr, out_ptr, M, N, A_KIND: tl.constexpr, B_KIND: tl.constexpr,
                     HAS_BIAS: tl.constexpr, OUT_BF16: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """The fused kernel's epilogue on cuBLAS's fp32 product: tensor scales, bias, one rounding."""
    m0 = tl.program_id(0) * BM
    top = tl.cast(m0, tl.int64) * N  # rows indexed from the tile's first: an (M, N) product may pass 2**31
    rm = tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = (rm < M - m0)[:, None] & (rn < N)[None, :]
    acc = tl.load(acc_ptr + top + rm[:, None] * N + rn[None, :], mask=mask, other=0.0)
    store_tile(apply_tensor_scales(acc, a_ts, b_ts, A_KIND, B_KIND), bias_ptr, out_ptr + top, rm, rn, M - m0, N,
               HAS_BIAS, OUT_BF16)


def exactness_flag(a: Operand, b: Operand) -> torch.Tensor | None:
    """The zeroed int32 device flag ``decode_pair`` sets where an MXFP8 operand's values are not exact in bf16 (the
    product then recomputed in fp32); None where neither operand is MXFP8 (NVFP4 and bf16 values always are)."""
    return torch.zeros(1, device=a.codes.device, dtype=torch.int32) if KIND_MXFP8 in (a.kind, b.kind) else None


def decode_bf16(op: Operand, flag: torch.Tensor | None = None) -> torch.Tensor:
    """(rows, K) bfloat16 values ``code · block scale`` of a quantized operand (NVFP4's tensor scale left out).
    Given ``flag`` (an int32 device scalar), sets it to 1 where a value is not exact in bf16 (MXFP8 only: NVFP4
    values always are)."""
    return decode_pair(op, None, flag)[0]


def decode_pair(a: Operand, b: Operand | None, flag: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``decode_bf16`` of ``a`` and of ``b`` (None: none), the quantized ones in one launch; a bf16 operand is its
    values."""
    interpret = interpreting()
    values, args, tiles = [], [], []
    for op in (a, b):
        if op is None or op.kind == KIND_BF16:
            values.append(None if op is None else op.codes)
            continue
        (codes, scales, _), meta = kernel_args(op)
        out = torch.empty(op.rows, op.k, device=codes.device, dtype=torch.float32 if interpret else torch.bfloat16)
        values.append(out)
        tiles.append(cdiv(op.rows, DECODE_R))
        args.append(((codes, scales, out), (*meta, op.tile_rows if op.kind == KIND_NVFP4 else 1,
                                            flag is not None and op.kind == KIND_MXFP8)))
    if args:
        (pa, ma), (pb, mb) = args[0], args[-1]  # one operand: B's arguments repeat A's, its branch never runs
        _decode_kernel[(sum(tiles), cdiv(a.k, DECODE_K))](
            *pa, *pb, pa[0] if flag is None else flag, pa[2].shape[0], pb[2].shape[0], a.k, tiles[0], *ma, *mb,
            BR=DECODE_R, BK=DECODE_K, IN_FP32=interpret, HW=hardware_fp8(a.codes.device))
    if interpret:  # the kernel wrote fp32 (exact), cast here
        values = [None if v is None else v.to(torch.bfloat16) for v in values]
    return values[0], values[1]


def scaled_mm_decoded(a: Operand, b: Operand, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """(M, K) · (N, K)ᵀ -> (M, N) in ``out_dtype``; operands already checked. The product of the decoded operands
    is cuBLAS's or Triton's, whichever ``gemm_choice`` measured faster for this GEMM. Nothing is read back to the
    host (values bf16 does not hold, MXFP8 scale exponents near E8M0's ends, are found on the device: ``_exact``)."""
    def product(da: torch.Tensor, db: torch.Tensor) -> torch.Tensor:
        products = {"cublas": lambda: _cublas(a, b, da, db, bias, out_dtype),
                    "triton": lambda: _triton_gemm(a, b, da, db, bias, out_dtype)}
        key = (size_bucket(a.rows), size_bucket(b.rows), size_bucket(a.k), a.kind, b.kind,
               None if bias is None else bias.dtype, out_dtype, _cublas_finishes(a, b, bias, out_dtype))
        return products[choose(key, products, da.device)]()

    return _exact(a, b, bias, out_dtype, product)


def scaled_mm_decoded_cublas(a: Operand, b: Operand, bias: torch.Tensor | None, out_dtype: torch.dtype
                             ) -> torch.Tensor:
    """``scaled_mm_decoded`` with cuBLAS's product."""
    return _exact(a, b, bias, out_dtype, lambda da, db: _cublas(a, b, da, db, bias, out_dtype))


def _cublas_finishes(a: Operand, b: Operand, bias: torch.Tensor | None, out_dtype: torch.dtype) -> bool:
    """Whether cuBLAS's own output is the product (no epilogue pass): no NVFP4 tensor scale, and either bf16 out
    (cuBLAS rounds its fp32 accumulator, plus a bf16 bias it adds in fp32, once) or fp32 out without a bias (the
    accumulator itself)."""
    if a.kind == KIND_NVFP4 or b.kind == KIND_NVFP4:
        return False
    if out_dtype == torch.bfloat16:
        return bias is None or bias.dtype == torch.bfloat16
    return out_dtype == torch.float32 and bias is None


@contextlib.contextmanager
def fp32_split_k_sums():
    """torch's ``allow_bf16_reduced_precision_reduction`` off inside (its split-K setting kept), restored after:
    cuBLAS then adds a bf16 GEMM's split-K partial sums in fp32, so its one rounding is of an fp32 accumulator."""
    matmul = torch.backends.cuda.matmul
    if not matmul.allow_bf16_reduced_precision_reduction:
        yield
        return
    split_k = matmul.allow_bf16_reduced_precision_reduction_split_k
    matmul.allow_bf16_reduced_precision_reduction = (False, split_k)
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction = (True, split_k)


def _cublas(a: Operand, b: Operand, da: torch.Tensor, db: torch.Tensor, bias: torch.Tensor | None,
            out_dtype: torch.dtype) -> torch.Tensor:
    """cuBLAS's product of the decoded ``da``, ``db``, then, unless cuBLAS's output is the product
    (``_cublas_finishes``), the epilogue pass (tensor scales of ``a``, ``b``, bias, the rounding)."""
    finishes = _cublas_finishes(a, b, bias, out_dtype)
    if finishes and da.is_cuda and out_dtype == torch.bfloat16:
        with fp32_split_k_sums():  # cuBLAS rounds its fp32 accumulator (+ bias) once to bf16
            return torch.mm(da, db.t()) if bias is None else torch.addmm(bias, da, db.t())
    acc = torch.mm(da, db.t(), out_dtype=torch.float32) if da.is_cuda else da.float() @ db.float().t()
    if finishes:  # the fp32 accumulator itself, or on the CPU the rounding cuBLAS would do
        return (acc if bias is None else acc + bias.float()).to(out_dtype)
    m, n = acc.shape
    out = torch.empty(m, n, device=acc.device, dtype=out_dtype)
    ts = [op.tensor_scale if op.kind == KIND_NVFP4 else acc for op in (a, b)]
    _epilogue_kernel[(cdiv(m, EPILOGUE_M), cdiv(n, EPILOGUE_N))](
        acc, *ts, bias if bias is not None else acc, out.view(torch.int16) if out_dtype == torch.bfloat16 else out,
        m, n, a.kind, b.kind, HAS_BIAS=bias is not None, OUT_BF16=out_dtype == torch.bfloat16, BM=EPILOGUE_M,
        BN=EPILOGUE_N)
    return out


def scaled_mm_decoded_triton(a: Operand, b: Operand, bias: torch.Tensor | None, out_dtype: torch.dtype, *,
                             blocks: tuple[int, int, int] = GEMM_BLOCKS, num_warps: int = GEMM_WARPS,
                             num_stages: int = GEMM_STAGES) -> torch.Tensor:
    """``scaled_mm_decoded`` with Triton's product (tile ``blocks``, launch options ``num_warps`` and
    ``num_stages``)."""
    return _exact(a, b, bias, out_dtype, lambda da, db: _triton_gemm(a, b, da, db, bias, out_dtype, blocks=blocks,
                                                                     num_warps=num_warps, num_stages=num_stages))


def scaled_mm_decoded_tma(a: Operand, b: Operand, bias: torch.Tensor | None, out_dtype: torch.dtype, *,
                          blocks: tuple[int, int, int] = TMA_BLOCKS, num_warps: int = TMA_WARPS,
                          num_stages: int = TMA_STAGES) -> torch.Tensor:
    """``scaled_mm_decoded`` with Triton's product reading its tiles through tensor descriptors
    (``decoded_gemm_tma``); not a product ``gemm_choice`` picks until a GPU has timed it."""
    return _exact(a, b, bias, out_dtype, lambda da, db: tma_gemm(a, b, da, db, bias, out_dtype, blocks=blocks,
                                                                 num_warps=num_warps, num_stages=num_stages))


def _triton_gemm(a: Operand, b: Operand, da: torch.Tensor, db: torch.Tensor, bias: torch.Tensor | None,
                 out_dtype: torch.dtype, *, blocks: tuple[int, int, int] = GEMM_BLOCKS, num_warps: int = GEMM_WARPS,
                 num_stages: int = GEMM_STAGES) -> torch.Tensor:
    """Triton's bf16 tensor-core GEMM of the decoded ``da``, ``db``, the NVFP4 tensor scales, bias and rounding
    applied to its fp32 accumulator in registers."""
    return launch(blocks, decoded(a, da), decoded(b, db), bias, out_dtype, bf16_dot(), num_warps=num_warps,
                  num_stages=num_stages)


def _exact(a: Operand, b: Operand, bias: torch.Tensor | None, out_dtype: torch.dtype, product) -> torch.Tensor:
    """``product`` of the operands decoded to bf16 (a function of the two decoded tensors), made exact: with an
    MXFP8 operand the decode flags on the device any value bf16 does not hold, and the fp32 kernel then recomputes
    the product in place (its programs return at once while the flag is clear)."""
    flag = exactness_flag(a, b)
    out = product(*decode_pair(a, b, flag))
    if flag is not None:
        scaled_mm_triton(a, b, bias, out_dtype, out=out, flag=flag)
    return out
