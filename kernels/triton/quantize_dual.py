"""One read of a 2D tensor, both quantized copies a layer's GEMMs need: rowwise (blocks along dim 1, the
fprop / dgrad operand) and columnwise (blocks along dim 0, the wgrad operand), each with its own rounding,
SR stream and RHT, as Transformer Engine's quantizers write them.

Each program quantizes one BR x BK tile both ways: rowwise as ``quantize_triton``'s tile kernels do, columnwise
in slices as ``quantize_cols_triton``'s kernels do (each thread holds whole blocks down the rows); the tile's
second reading comes from cache, so the source crosses HBM once (twice for NVFP4, whose tensor scales need the
amax of the whole tensor first: one pass computes both copies' amaxes). SR bits are hashed in the kernel (a
``StepStream``'s keys from its step, read on the device). Tiles and warps are autotuned on a GPU (the interpreter
runs the first config). The two copies are byte for byte what two ``quantize_triton`` calls (and the reference)
make. Compiled for sm_90 as the graph launches it on a row-major bf16 gradient, its two copies take fewer
instructions per element than the rowwise and column slice kernels it replaces (tests/ptx_report.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoprec.formats import NVFP4, Format

from ..core.launch import cdiv, nvfp4_hardware
from ..core.quantized import QuantCopy, QuantizedTensor
from .autotune import autotune
from .block_scales import atomic_max_bits
from .quantize_cols import mxfp8_slices_tile, nvfp4_slices_tile, slices_amax
from .quantize_rows import (
    INTERPRETER_TILE,
    hashed_stream,
    index_strides,
    kernel_keys,
    mxfp8_meta,
    mxfp8_tile,
    nvfp4_tile,
    rht_operand,
    tile_amax,
)

# (BR, BK, warps): the columnwise copy's slices run along the BK columns, so BK is the wide side (a slice of
# BK x BR/32 elements fills the threads); MXFP8's BR holds whole 32-row blocks. Not yet timed on a GPU.
NVFP4_CONFIGS = [triton.Config({"BR": br, "BK": bk}, num_warps=w) for br, bk, w in (
    (32, 128, 4), (16, 256, 8), (32, 64, 4))]
MXFP8_CONFIGS = [triton.Config({"BR": br, "BK": bk}, num_warps=w) for br, bk, w in (
    (32, 128, 4), (32, 256, 8), (64, 64, 4))]
DUAL_KEY_ARGS = ["k1_a", "k2_a", "k1_b", "k2_b"]  # SR keys: scalars, never specialized (quantize_rows.KEY_ARGS)


@autotune(NVFP4_CONFIGS, INTERPRETER_TILE, ["R", "K"])
@triton.jit
def _amax2_kernel(x_ptr, m_ptr, amax_ptr, R, K, s_r, s_k, BR: tl.constexpr, BK: tl.constexpr, RHT_A: tl.constexpr,
                  RHT_B: tl.constexpr):
    """The amaxes of the rowwise copy's source (RHT along dim 1) and the columnwise one's (along dim 0), as
    fp32 bits into ``amax_ptr[0]`` and ``amax_ptr[1]`` (zeroed first)."""
    pid_r, pid_k = tl.program_id(0), tl.program_id(1)
    a = tile_amax(x_ptr, m_ptr, R, K, s_r, s_k, pid_r, pid_k, BR, BK, RHT_A)
    b = a
    if RHT_A or RHT_B:
        b = slices_amax(x_ptr, m_ptr, K, R, s_k, s_r, pid_k, pid_r, BK, BR, RHT_B)
    atomic_max_bits(amax_ptr, a)
    atomic_max_bits(amax_ptr + 1, b)


@autotune(NVFP4_CONFIGS, INTERPRETER_TILE, ["R", "K"])
@triton.jit(do_not_specialize=DUAL_KEY_ARGS)
def _nvfp4_dual_kernel(x_ptr, m_ptr, R, K, s_r, s_k,
                       k1_a, k2_a, step_a, codes_a, scales_a, amax_a, ts_a, ia_r, ia_k,
                       k1_b, k2_b, step_b, codes_b, scales_b, amax_b, ts_b, ib_r, ib_k,
                       BR: tl.constexpr, BK: tl.constexpr, RHT_A: tl.constexpr, SR_A: tl.constexpr,
                       HASH_A: tl.constexpr, RHT_B: tl.constexpr, SR_B: tl.constexpr, HASH_B: tl.constexpr,
                       HW: tl.constexpr):
    pid_r, pid_k = tl.program_id(0), tl.program_id(1)
    nvfp4_tile(x_ptr, m_ptr, step_a, k1_a, k2_a, codes_a, scales_a, amax_a, ts_a, R, K, s_r, s_k, ia_r, ia_k,
               pid_r, pid_k, BR, BK, RHT_A, SR_A, HASH_A, False, HW)
    nvfp4_slices_tile(x_ptr, m_ptr, step_b, k1_b, k2_b, codes_b, scales_b, amax_b, ts_b, K, R, s_k, s_r, ib_r, ib_k,
                      pid_k, pid_r, BK, BR, RHT_B, SR_B, HASH_B, HW)


@autotune(MXFP8_CONFIGS, INTERPRETER_TILE, ["R", "K"])
@triton.jit(do_not_specialize=DUAL_KEY_ARGS)
def _mxfp8_dual_kernel(x_ptr, m_ptr, R, K, s_r, s_k,
                       k1_a, k2_a, step_a, codes_a, scales_a, ia_r, ia_k, k1_b, k2_b, step_b, codes_b, scales_b,
                       ib_r, ib_k, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, EMAX: tl.constexpr,
                       MAX: tl.constexpr, FLOOR: tl.constexpr, HW: tl.constexpr,
                       BR: tl.constexpr, BK: tl.constexpr, RHT_A: tl.constexpr, SR_A: tl.constexpr,
                       HASH_A: tl.constexpr, RHT_B: tl.constexpr, SR_B: tl.constexpr, HASH_B: tl.constexpr):
    pid_r, pid_k = tl.program_id(0), tl.program_id(1)
    mxfp8_tile(x_ptr, m_ptr, step_a, k1_a, k2_a, codes_a, scales_a, R, K, s_r, s_k, ia_r, ia_k, pid_r, pid_k,
               EBITS, MBITS, BIAS, EMAX, MAX, FLOOR, HW, BR, BK, RHT_A, SR_A, HASH_A)
    mxfp8_slices_tile(x_ptr, m_ptr, step_b, k1_b, k2_b, codes_b, scales_b, K, R, s_k, s_r, ib_r, ib_k, pid_k, pid_r,
                      EBITS, MBITS, BIAS, EMAX, MAX, FLOOR, HW, BK, BR, RHT_B, SR_B, HASH_B)


def quantize_dual_triton(x: torch.Tensor, fmt: Format, rows: QuantCopy, cols: QuantCopy, *, scale_mode: str = "rceil",
                         rht_signs_: torch.Tensor | None = None, amax: torch.Tensor | None = None
                         ) -> tuple[QuantizedTensor, QuantizedTensor]:
    """The rowwise (blocks along dim 1) and columnwise (along dim 0) quantizations of 2D ``x`` from one read of
    it (checked by ``dual_problem``), each as ``quantize`` returns its copy's source's (x or x.t()). ``amax``:
    NVFP4's tensor amax cell of x, both copies' where neither takes the RHT (``dispatch.check_amax``), so no amax
    pass runs."""
    n_rows, k = x.shape
    m = rht_operand(x, rows.rht or cols.rht, rht_signs_)

    # each copy is the quantization of its source (x or x.t()) along an axis: its SR bits index that source
    # (the index strides of its (rows, K) view), and it is returned as ``quantize`` returns that quantization
    sources = [rows.source(x, 1), cols.source(x, 0)]
    ia, ib = (index_strides(src.shape, axis) for src, axis in sources)
    # each copy's SR bits hashed in the kernel: (k1, k2, the step a StepStream's keys take on the device)
    modes = [hashed_stream(c.seed, x) for c in (rows, cols)]
    keys = [(*kernel_keys(c.seed), step) for c, (_, step) in zip((rows, cols), modes)]
    grid = lambda meta: (cdiv(n_rows, meta["BR"]), cdiv(k, meta["BK"]))  # noqa: E731
    sides = dict(RHT_A=rows.rht, SR_A=rows.seed is not None, HASH_A=modes[0][0], RHT_B=cols.rht,
                 SR_B=cols.seed is not None, HASH_B=modes[1][0])
    if fmt is NVFP4:
        if amax is None:
            amax = torch.zeros(2, device=x.device, dtype=torch.int32)  # fp32 bits of each copy's amax
            _amax2_kernel[grid](x, m, amax, n_rows, k, x.stride(0), x.stride(1), RHT_A=rows.rht, RHT_B=cols.rht)
        else:
            amax = amax.reshape(1).expand(2)  # one cell, read by both copies
        codes = [torch.empty(n_rows, k // 2, device=x.device, dtype=torch.uint8),
                 torch.empty(k, n_rows // 2, device=x.device, dtype=torch.uint8)]
        scales = [torch.empty(n_rows, k // 16, device=x.device, dtype=torch.uint8),
                  torch.empty(k, n_rows // 16, device=x.device, dtype=torch.uint8)]
        # a tensor scale each: the op returns both, and a custom op's outputs may not share storage
        s_dec = [torch.empty((), device=x.device, dtype=torch.float32) for _ in range(2)]
        _nvfp4_dual_kernel[grid](x, m, n_rows, k, x.stride(0), x.stride(1),
                                 *keys[0], codes[0], scales[0], amax[0:], s_dec[0], *ia,
                                 *keys[1], codes[1], scales[1], amax[1:], s_dec[1], *ib,
                                 HW=nvfp4_hardware(x.device), **sides)
        return tuple(QuantizedTensor(NVFP4, c, s.view(torch.float8_e4m3fn), d, axis, src.shape, 1)
                     for c, s, d, (src, axis) in zip(codes, scales, s_dec, sources))
    elem = fmt.elem
    codes = [torch.empty(n_rows, k, device=x.device, dtype=torch.uint8),
             torch.empty(k, n_rows, device=x.device, dtype=torch.uint8)]
    scales = [torch.empty(n_rows, k // 32, device=x.device, dtype=torch.uint8),
              torch.empty(k, n_rows // 32, device=x.device, dtype=torch.uint8)]
    _mxfp8_dual_kernel[grid](x, m, n_rows, k, x.stride(0), x.stride(1), *keys[0], codes[0], scales[0], *ia,
                             *keys[1], codes[1], scales[1], *ib, **mxfp8_meta(fmt, scale_mode, x.device),
                             **sides)
    return tuple(QuantizedTensor(fmt, c.view(elem.torch_dtype), s, None, axis, src.shape)
                 for c, s, (src, axis) in zip(codes, scales, sources))
