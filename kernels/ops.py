"""torch.library ops (``torch.ops.autoprec.*``) with fake implementations, so quantize, dequantize and the
block-scaled matmul trace under torch.compile as single opaque nodes.

Codes and scales cross the op boundary as uint8 (float8 bytes viewed as bytes); the format string
says how to read them.

The ops are defined on a ``torch.library.Library`` with one CPU and CUDA kernel each (``_op``), not with
``torch.library.custom_op``, whose per-call wrapping (an autograd kernel, alias checks on the outputs, a
dynamo guard) costs about 15 us of host time per call (``benchmarks/host_overhead.py``): a GPU step runs
hundreds of these calls, each from inductor's Python wrapper unless CUDA graphs replay them. They have no
autograd formula: the compiled graphs call them on forward and backward tensors alike."""
from __future__ import annotations

import torch

from autoprec.formats import BF16, FP8_BLOCK, NVFP4, get_format

from . import weight_cache
from .core.quantized import QuantCopy, QuantizedTensor, normalize_axis
from .core.random_bits import StepStream
from .dispatch import dense as dispatch
from .dispatch import grouped_mm as grouped
from .dispatch import scaled_mm as routed_scaled_mm
from .dispatch.grouped_route import grouped_route
from .reference.hadamard import rht_signs

Tensor = torch.Tensor
_LIB = torch.library.Library("autoprec", "DEF")


def _op(tags: tuple = (), name: str | None = None):
    """Define ``torch.ops.autoprec.<name>`` (default: fn's name) with the schema of ``fn``'s annotations and ``fn``
    as its CPU and CUDA kernel; returns ``fn``, whose fake implementation the caller registers with ``_fake``."""
    def define(fn):
        name_ = name or fn.__name__
        _LIB.define(name_ + torch.library.infer_schema(fn, mutates_args=()), tags=tags)
        for key in ("CPU", "CUDA"):
            _LIB.impl(name_, fn, key)
        return fn
    return define


def _fake(op, name: str | None = None):
    """Register the decorated function as the fake (shape-only) implementation of ``op`` (defined as ``name``)."""
    return lambda fn: torch.library.register_fake(f"autoprec::{name or op.__name__}", fn, lib=_LIB)


def _stored_shape(shape, axis: int) -> list:
    dims = list(shape)
    return dims[:axis] + dims[axis + 1 :] + [dims[axis]]


@_op()
def quantize(
    x: Tensor, fmt: str, axis: int, rounding: str, seed: int, tile2d: bool, scale_mode: str, rht: bool,
    rht_seed: int, step: Tensor, amax: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """uint8 (codes, scales) and the fp32 tensor_scale of ``dispatch.quantize`` (``_parts``). With SR,
    the bits hash ``seed`` and ``step`` (the model's call counter when the forward ran: a
    backward quantization reads the step of its own forward, so each micro-batch draws fresh bits; a
    ``StepStream``: a GPU kernel reads ``step`` where it lives). The RHT signs come from ``rht_seed``.
    ``amax``: NVFP4 without the RHT, the int32 fp32 bits of max|x| over x's finite values, computed by the graph
    (``passes/graph_amax.py``); the Triton quantizers take it instead of their own amax pass."""
    stream = StepStream(seed, step) if rounding == "sr" else seed
    return _parts(dispatch.quantize(x, fmt, axis, rounding=rounding, seed=stream, tile2d=tile2d,
                                    scale_mode=scale_mode, rht=rht, rht_signs=rht_signs(rht_seed) if rht else None,
                                    amax=amax))


@_fake(quantize)
def _(x, fmt, axis, rounding, seed, tile2d, scale_mode, rht, rht_seed, step, amax=None):
    return _quantized_like(x, fmt, axis, tile2d)


@_op()
def quantize_dual(
    x: Tensor, fmt: str, rounding_a: str, seed_a: int, rht_a: bool, transposed_a: bool,
    rounding_b: str, seed_b: int, rht_b: bool, transposed_b: bool, scale_mode: str, rht_seed: int, step: Tensor,
    amax: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``quantize``'s parts of 2D ``x``'s rowwise copy (a: blocks along dim 1) then of its columnwise copy
    (b: along dim 0), from one read of ``x`` where the Triton kernel runs. Copy a (b) is the quantization
    ``quantize`` makes of x, or of x.t() where ``transposed_a`` (``transposed_b``): the op replaces two
    such quantize nodes (passes/pair_quantize.py) and makes their bytes. ``amax`` as ``quantize``'s, for both
    copies."""
    copies = [QuantCopy(StepStream(seed, step) if rounding == "sr" else None, rht, t)
              for rounding, seed, rht, t in ((rounding_a, seed_a, rht_a, transposed_a),
                                             (rounding_b, seed_b, rht_b, transposed_b))]
    signs = rht_signs(rht_seed) if rht_a or rht_b else None
    qa, qb = dispatch.quantize_dual(x, fmt, *copies, scale_mode=scale_mode, rht_signs=signs, amax=amax)
    return (*_parts(qa), *_parts(qb))


@_fake(quantize_dual)
def _(x, fmt, rounding_a, seed_a, rht_a, transposed_a, rounding_b, seed_b, rht_b, transposed_b, scale_mode,
      rht_seed, step, amax=None):
    return (*_quantized_like(x, fmt, 1, False), *_quantized_like(x, fmt, 0, False))


def _parts(q: QuantizedTensor) -> tuple[Tensor, Tensor, Tensor]:
    """(uint8 codes, uint8 scales, fp32 tensor scale) of a quantization. MXFP8 has no tensor scale: its slot is an
    empty fp32 tensor, which a GPU makes without a launch (a filled scalar cost one per quantization)."""
    ts = q.tensor_scale if q.tensor_scale is not None else q.codes.new_empty((0,), dtype=torch.float32)
    return q.codes.view(torch.uint8), q.scales.view(torch.uint8), ts


def _quantized_like(x: Tensor, fmt: str, axis: int, tile2d: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Empty parts shaped as ``quantize`` returns them for ``x`` along ``axis``."""
    f = get_format(fmt)
    axis = normalize_axis(axis, x.ndim)
    stored = _stored_shape(x.shape, axis)
    lead, k = stored[:-1], stored[-1]
    codes = x.new_empty(lead + [k // 2] if f is NVFP4 else stored, dtype=torch.uint8)
    blocks = [lead[0] // f.tile, k // f.block_size] if tile2d else lead + [k // f.block_size]
    scale_bytes = f.scale.bits // 8
    scales = x.new_empty(blocks[:-1] + [blocks[-1] * scale_bytes], dtype=torch.uint8)
    return codes, scales, x.new_empty(() if f is NVFP4 else (0,), dtype=torch.float32)


@_op()
def transpose_tiles(codes: Tensor, scales: Tensor, fmt: str = "nvfp4") -> tuple[Tensor, Tensor]:
    """The stored uint8 (codes, scales) of the transpose of a square-tiled matrix stored (R, K) (NVFP4's 16x16
    tiles, FP8-block's 128x128): the same tiles with the same scales and every element with its code, now blocked
    along the other dim. With square tiles this is exactly the quantization of the transposed matrix, so a weight
    quantized for fprop serves its dgrad too (``dispatch.transpose_tiles``)."""
    return dispatch.transpose_tiles(codes, scales, fmt)


@_fake(transpose_tiles)
def _(codes, scales, fmt="nvfp4"):
    rows, k = codes.shape
    if get_format(fmt) is FP8_BLOCK:  # fp32 scales as bytes
        scale_bytes = FP8_BLOCK.scale.bits // 8
        return codes.new_empty((k, rows)), scales.new_empty((k // FP8_BLOCK.tile, scales.shape[0] * scale_bytes))
    return codes.new_empty((2 * k, rows // 2)), scales.new_empty((scales.shape[1], scales.shape[0]))


def from_parts(
    codes: Tensor, scales: Tensor, ts: Tensor, fmt: str, axis: int, shape, tile_rows: int
) -> QuantizedTensor:
    """Rebuild the QuantizedTensor that ``quantize`` returned in parts."""
    f = get_format(fmt)
    if f is NVFP4:
        return QuantizedTensor(f, codes, scales.view(torch.float8_e4m3fn), ts, axis, torch.Size(shape), tile_rows)
    scales = scales.view(torch.float32) if f is FP8_BLOCK else scales
    return QuantizedTensor(f, codes.view(f.elem.torch_dtype), scales, None, axis, torch.Size(shape), tile_rows)


@_op()
def dequantize(
    codes: Tensor, scales: Tensor, tensor_scale: Tensor, fmt: str, axis: int, shape: list[int], tile_rows: int
) -> Tensor:
    """fp32 values of a quantized tensor given in parts, contiguous in its logical ``shape``."""
    return dispatch.dequantize(from_parts(codes, scales, tensor_scale, fmt, axis, shape, tile_rows)).contiguous()


@_fake(dequantize)
def _(codes, scales, tensor_scale, fmt, axis, shape, tile_rows):
    return codes.new_empty(shape, dtype=torch.float32)


def _operand(codes: Tensor, scales: Tensor, ts: Tensor, fmt: str, is_b: bool, tile_rows: int):
    """A scaled_mm operand from parts stored (..., rows, K): a QuantizedTensor, or bf16 values."""
    f = get_format(fmt)
    if f is BF16:
        return codes.transpose(-1, -2) if is_b else codes
    rows, k = codes.shape[-2], codes.shape[-1] * (2 if f is NVFP4 else 1)
    lead = list(codes.shape[:-2])
    shape = lead + ([k, rows] if is_b else [rows, k])
    return from_parts(codes, scales, ts, fmt, len(shape) - (2 if is_b else 1), shape, tile_rows)


@_op()
def scaled_mm(
    a_codes: Tensor, a_scales: Tensor, a_ts: Tensor, a_fmt: str,
    b_codes: Tensor, b_scales: Tensor, b_ts: Tensor, b_fmt: str, b_tile_rows: int,
    bias: Tensor | None, out_dtype: torch.dtype,
) -> Tensor:
    """A·B with A (..., M, K) and B stored (..., N, K), both blocked along K (bf16 operands: their
    values in that layout, with any tensor passed as scales). ``a_ts`` / ``b_ts``: NVFP4's tensor scales; any
    tensor (unread) for the other formats."""
    a = _operand(a_codes, a_scales, a_ts, a_fmt, False, 1)
    b = _operand(b_codes, b_scales, b_ts, b_fmt, True, b_tile_rows)
    return routed_scaled_mm(a, b, bias, out_dtype)


@_fake(scaled_mm)
def _(a_codes, a_scales, a_ts, a_fmt, b_codes, b_scales, b_ts, b_fmt, b_tile_rows, bias, out_dtype):
    return a_codes.new_empty((*a_codes.shape[:-1], b_codes.shape[-2]), dtype=out_dtype)


# The cached-weight product reads the host (the weight's version counter, the cache), which a CUDA graph capture
# cannot hold: a replay would multiply by the weight prepared at capture time
@_op(tags=(torch.Tag.cudagraph_unsafe,))
def scaled_mm_weight(
    a_codes: Tensor, a_scales: Tensor, a_ts: Tensor, a_fmt: str, w: Tensor, w_fmt: str, w_tile2d: bool,
    scale_mode: str, key: str, bias: Tensor | None, out_dtype: torch.dtype,
) -> Tensor:
    """``scaled_mm`` with B a weight ``w`` (K, N) given as it is, quantized to ``w_fmt`` along K (or cast to bf16)
    once per weight version and kept under ``key`` (``weight_cache``): the same product as quantizing it in the graph,
    bit for bit. On the CPU path the decoded fp32 values are kept, which is what its reference product multiplies."""
    a = _operand(a_codes, a_scales, a_ts, a_fmt, False, 1)
    b = weight_cache.prepared(key, w, lambda: _prepared_weight(w, w_fmt, w_tile2d, scale_mode))
    if isinstance(b, torch.Tensor) and b.dtype == torch.float32:
        return dispatch.reference_scaled_mm(a, b, bias, out_dtype)
    return routed_scaled_mm(a, b, bias, out_dtype)


def _prepared_weight(w: Tensor, fmt: str, tile2d: bool, scale_mode: str):
    """B's operand as ``scaled_mm`` reads it, or on a path that runs the reference product its fp32 values."""
    if get_format(fmt).quantized:
        q = dispatch.quantize(w, fmt, w.ndim - 2, tile2d=tile2d, scale_mode=scale_mode)
        b = _operand(*_parts(q), fmt, True, q.tile_rows)
    else:
        b = w.to(torch.bfloat16)
    return dispatch.reference_values(b) if dispatch.runs_reference(w.device) else b


@_fake(scaled_mm_weight)
def _(a_codes, a_scales, a_ts, a_fmt, w, w_fmt, w_tile2d, scale_mode, key, bias, out_dtype):
    return a_codes.new_empty((*a_codes.shape[:-1], w.shape[-1]), dtype=out_dtype)


# The grouped op reads its group offsets on the host on some paths (grouped_route's host_read: the CPU loop, products
# no grouped kernel takes), which a CUDA graph cannot capture: the tag makes inductor's mode="reduce-overhead" leave
# its graphs uncaptured (or, with graph partitions, run the op between captured parts) instead of failing inside the
# capture. The rewrite emits the same op without the tag, ``grouped_mm_on_device``, where the reason is None (bf16
# products on torch's grouped GEMM, the quantized grouped paths of sm_90 and sm_100).
@_op(tags=(torch.Tag.cudagraph_unsafe,))
def grouped_mm(
    a: Tensor, b: Tensor, offs: Tensor | None, fmt: str, rounding_a: str, rounding_b: str, tile2d_b: bool,
    rht: bool, seed_a: int, seed_b: int, scale_mode: str, rht_seed: int, step: Tensor, out_dtype: torch.dtype,
    amax_a: Tensor | None = None,
) -> Tensor:
    """``grouped.grouped_mm`` (an experts GEMM, see its layouts) in ``fmt``: ``exact`` (the traced op's
    product), ``bf16`` or a block format, each group quantized on its own with SR streams from
    ``seed_a`` / ``seed_b`` and ``step`` (``amax_a``: the tokens' static NVFP4 amax). Inside a CUDA graph capture,
    a call that would read the host raises, naming why (a capture cannot hold the read)."""
    if a.is_cuda and torch.cuda.is_current_stream_capturing():
        layout = grouped.grouped_layout(a.ndim, b.ndim, offs is not None)
        groups = grouped.group_count(a.shape, None if offs is None else offs.shape, layout)
        why = grouped_route(a.device, layout, fmt, (a.dtype, b.dtype), (a.shape, b.shape), groups, tile2d_b,
                            out_dtype).host_read
        if why:
            raise RuntimeError(f"autoprec grouped_mm inside a CUDA graph capture would read the host: {why}")
    return grouped.grouped_mm(a, b, offs, fmt, rounding_a=rounding_a, rounding_b=rounding_b, tile2d_b=tile2d_b,
                              rht=rht, rht_signs=rht_signs(rht_seed) if rht else None, seeds=(seed_a, seed_b),
                              step=step, scale_mode=scale_mode, out_dtype=out_dtype, amax_a=amax_a)


_op(name="grouped_mm_on_device")(grouped_mm)


def _grouped_fake(a, b, offs, fmt, rounding_a, rounding_b, tile2d_b, rht, seed_a, seed_b, scale_mode, rht_seed, step,
                  out_dtype, amax_a=None):
    layout = grouped.grouped_layout(a.ndim, b.ndim, offs is not None)
    shape = grouped.grouped_output_shape(a.shape, b.shape, None if offs is None else offs.shape, layout)
    return a.new_empty(shape, dtype=out_dtype)


_fake(grouped_mm)(_grouped_fake)
_fake(grouped_mm, "grouped_mm_on_device")(_grouped_fake)
