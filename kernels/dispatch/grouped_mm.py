"""Grouped GEMMs (mixture-of-experts experts): ``aten._grouped_mm``'s semantics, exact or quantized.

Layouts (``offs`` holds the cumulative end of each group along the token dim): ``2d3d`` a (T, K) tokens sorted by
expert times b (E, K, N) expert weights -> (T, N), for fprop and dgrad; ``2d2d`` a (M, T) times b (T, N), groups
along the reduction -> (E, M, N), the wgrad; ``3d3d`` a (E, M, K) times b (E, K, N) -> (E, M, N), a batch.

A quantized grouped GEMM is, by definition, the dense quantized GEMM of each group: every group's operands are
quantized on their own (NVFP4: a tensor scale per expert and per token group), blocked along the reduction dim, SR
from the stream ``group_seed(seed, g)``; a reduction that is not whole blocks is zero-padded inside the quantizer.
Rows past the last offset are zero. Which implementation runs is ``grouped_route``'s one decision; docs/moe.md
says what each route does and where it reads the host. Offsets out of order or out of range raise on the host paths
(``group_bounds``); the device paths never read them on the host and never read or write outside their tensors.
"""
from __future__ import annotations

import torch

from autoprec.formats import get_format

from ..core.quantized import QuantizedGroups
from ..core.random_bits import group_seed, sr_stream
from ..cuda.grouped_bf16 import torch_grouped_mm
from ..triton.grouped_bf16 import bf16_grouped_mm
from . import dense as dispatch
from . import grouped as grouped_dispatch
from .grouped import group_bounds, grouped_format_problem
from .grouped_route import EXACT, grouped_route


def grouped_layout(a_ndim: int, b_ndim: int, has_offs: bool) -> str | None:
    """The layout of a grouped product (None for one autoprec does not plan, e.g. 3d x 2d)."""
    layout = f"{a_ndim}d{b_ndim}d"
    if layout in ("2d3d", "2d2d") and has_offs or layout == "3d3d" and not has_offs:
        return layout
    return None


def group_count(a_shape, offs_shape, layout: str):
    """How many groups a grouped product has: one per offset, or per batch item of 3d x 3d."""
    return a_shape[0] if layout == "3d3d" else offs_shape[0]


def grouped_output_shape(a_shape, b_shape, offs_shape, layout: str) -> tuple:
    """The output shape of a grouped product (sizes may be symbolic)."""
    if layout == "2d3d":
        return (a_shape[0], b_shape[-1])
    groups = group_count(a_shape, offs_shape, layout)
    return (groups, a_shape[-2], b_shape[-1])


def _groups(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None, layout: str):
    """(group index, output slot, a_g (M, K), b_g (K, N)) for every group."""
    if layout == "3d3d":
        return [(g, g, a[g], b[g]) for g in range(a.shape[0])]
    if layout == "2d3d":
        bounds = group_bounds(offs, a.shape[0])
        return [(g, slice(s, e), a[s:e], b[g]) for g, (s, e) in enumerate(bounds)]
    bounds = group_bounds(offs, a.shape[1])
    return [(g, g, a[:, s:e], b[s:e]) for g, (s, e) in enumerate(bounds)]


def grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None,
    fmt: str = EXACT,
    *,
    rounding_a: str = "rne",
    rounding_b: str = "rne",
    tile2d_b: bool = False,
    rht: bool = False,
    rht_signs: torch.Tensor | None = None,
    seeds: tuple[int, int] = (0, 0),
    step: torch.Tensor | int = 0,
    scale_mode: str = "rceil",
    out_dtype: torch.dtype | None = None,
    amax_a: torch.Tensor | None = None,
) -> torch.Tensor:
    """The grouped product of ``a`` and ``b`` (see the module doc for layouts) in ``fmt``: each group the dense
    GEMM ``dispatch.scaled_mm`` of its own quantized operands (``exact``: ``torch.mm`` in the operands' dtype), run
    on the path the module doc describes. Outside ``exact``, an output dtype the kernels do not write (float16) is
    their float32 product rounded once, as ``dispatch.scaled_mm`` rounds it. ``amax_a``: a static NVFP4 tensor
    amax (int32 fp32 bits) for every token group of a 2d x 3d product's ``a`` in place of each group's own, so a
    token's quantization does not depend on the tokens routed with it (the RL phases)."""
    layout = grouped_layout(a.ndim, b.ndim, offs is not None)
    if layout is None:
        raise ValueError(f"grouped_mm: shapes {tuple(a.shape)} x {tuple(b.shape)} with"
                         f"{'' if offs is not None else 'out'} offsets are not a supported layout")
    if fmt != EXACT and get_format(fmt).quantized and grouped_format_problem(get_format(fmt).name):
        raise ValueError(f"grouped_mm: {grouped_format_problem(get_format(fmt).name)}")
    if amax_a is not None and (layout != "2d3d" or fmt != "nvfp4"):
        raise ValueError(f"grouped_mm(amax_a=...): a static amax is for the NVFP4 tokens of a 2d x 3d product, got "
                         f"format {fmt} with layout {layout}")
    out_dtype = out_dtype or a.dtype
    if fmt != EXACT and dispatch.kernel_out_dtype(out_dtype) != out_dtype:
        return grouped_mm(a, b, offs, fmt, rounding_a=rounding_a, rounding_b=rounding_b, tile2d_b=tile2d_b, rht=rht,
                          rht_signs=rht_signs, seeds=seeds, step=step, scale_mode=scale_mode,
                          out_dtype=torch.float32, amax_a=amax_a).to(out_dtype)
    shape = grouped_output_shape(a.shape, b.shape, None if offs is None else offs.shape, layout)
    if not a.numel() or not b.numel():  # no tokens, experts or features: nothing to sum
        return a.new_zeros(shape, dtype=out_dtype)
    groups = group_count(a.shape, None if offs is None else offs.shape, layout)
    route = grouped_route(a.device, layout, fmt, (a.dtype, b.dtype), (a.shape, b.shape), groups, tile2d_b, out_dtype)
    if route.kind == "experts":
        # a reduction that is not whole blocks zero-padded in the quantizers, as each group alone pads it
        quantize = dict(fmt=fmt, step=step, scale_mode=scale_mode, rht=rht, rht_signs=rht_signs, pad_k=True)
        if layout == "3d3d":
            qa = _item_rows(a, rounding_a, seeds[0], quantize)
        else:
            qa = grouped_dispatch.quantize_row_groups(a, offs=offs, rounding=rounding_a, seed=seeds[0], amax=amax_a,
                                                      **quantize)
        qb = grouped_dispatch.quantize_batches(b, rounding=rounding_b, seed=seeds[1], tile2d=tile2d_b, **quantize)
        return grouped_dispatch.experts_mm(qa, qb, offs, out_dtype, route.path).view(shape)
    if route.kind == "wgrad":
        return grouped_dispatch.wgrad_mm(a, b, offs, get_format(fmt), route.path, out_dtype, rounding_a=rounding_a,
                                         rounding_b=rounding_b, seeds=seeds, step=step, scale_mode=scale_mode, rht=rht,
                                         rht_signs=rht_signs)
    if route.kind == "torch":
        return torch_grouped_mm(a, b, offs, layout)
    if route.kind == "triton_bf16":
        return bf16_grouped_mm(a, b, offs, layout, out_dtype)
    every = _groups(a, b, offs, layout)
    groups = [(g, slot, ag, bg) for g, slot, ag, bg in every if ag.shape[0] and ag.shape[1] and bg.shape[1]]
    if route.kind == "loop":
        out = a.new_zeros(shape, dtype=out_dtype)
        for _, slot, ag, bg in groups:
            if fmt != EXACT:
                out[slot] = dispatch.scaled_mm(ag.bfloat16(), bg.bfloat16(), None, out_dtype)
            else:  # in the wider of the operands' and the output's dtype (a bf16 product into fp32 is not rounded)
                wide = torch.promote_types(ag.dtype, out_dtype)
                out[slot] = torch.mm(ag.to(wide), bg.to(wide))
        return out
    step = int(step)  # the per-group quantizations' SR streams, made on the host
    f = get_format(fmt)
    quantized = []
    for g, slot, ag, bg in groups:
        k = grouped_dispatch.whole_blocks(ag.shape[1], f)  # each group's reduction, to whole blocks
        ag, bg = grouped_dispatch.zero_padded(ag, 1, k), grouped_dispatch.zero_padded(bg, 0, k)
        qa = _quantize(ag, fmt, 1, rounding_a, group_seed(seeds[0], g), step, False, scale_mode, rht, rht_signs,
                       amax_a)
        qb = _quantize(bg, fmt, 0, rounding_b, group_seed(seeds[1], g), step, tile2d_b, scale_mode, rht, rht_signs)
        quantized.append((g, slot, qa, qb))
    out = a.new_zeros(shape, dtype=out_dtype)
    for _, slot, qa, qb in quantized:
        out[slot] = dispatch.scaled_mm(qa, qb, None, out_dtype)
    return out


def _item_rows(a: torch.Tensor, rounding: str, seed: int, quantize: dict) -> QuantizedGroups:
    """A 3d x 3d product's (E, M, K) items quantized along K as the equal token groups of their (E·M, K) rows, bit
    for bit, by the batch quantizer, which reads each item where it lies (stored transposed too, as a wgrad's aᵀ
    is): each item as its (K, M) transpose, SR bits keyed on the item's own indices."""
    (items, m, _), q = a.shape, grouped_dispatch.quantize_batches(a.transpose(1, 2), rounding=rounding, seed=seed,
                                                                  sr_of_transpose=True, **quantize)
    return QuantizedGroups(q.fmt, q.codes.reshape(items * m, -1), q.scales.reshape(items * m, -1), q.tensor_scales,
                           torch.Size((items * m, q.shape[1])))


def _quantize(x, fmt, axis, rounding, seed, step, tile2d, scale_mode, rht, rht_signs, amax=None):
    return dispatch.quantize(x, fmt, axis, rounding=rounding, seed=sr_stream(seed, step) if rounding == "sr" else 0,
                             tile2d=tile2d, scale_mode=scale_mode, rht=rht, rht_signs=rht_signs, amax=amax)
