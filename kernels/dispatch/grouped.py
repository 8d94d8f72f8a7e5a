"""Where a grouped (experts) GEMM's pieces run, as ``dispatch`` picks them for dense ones: the grouped quantizers
(every token group, every expert weight, a wgrad's token groups along the reduction) and the grouped products of
quantized groups.

``grouped_gemm_path`` picks: ``native_grouped`` (sm_100, one ``torch.nn.functional.scaled_grouped_mm``
on the grouped quantizers' buffers), else one Triton launch for every group (``grouped_mm_triton``:
``decoded_grouped`` on a GPU, ``triton_grouped`` in the interpreter or with ``AUTOPREC_KERNELS=triton``), else
``per_group`` (one dense ``dispatch.scaled_mm`` per group, the bounds read on the host). ``grouped_route`` asks
it once per product, from formats and shapes alone (a wgrad's before quantizing, since the K-grouped quantization
feeds both the native and the Triton path), and the product runs what it picked. None of the grouped paths but
``per_group`` reads the offsets on the host. Where Triton does not run (CPU), every group is quantized and
multiplied on its own.
"""
from __future__ import annotations

import torch

from autoprec.formats import NVFP4, Format, get_format

from ..core.mode import kernel_mode
from ..core.operand import Operand
from ..core.quantized import QuantizedGroups
from ..core.random_bits import group_seed, sr_stream
from ..cuda.scaled_grouped_mm import (
    NATIVE_GROUPED_MAJORS,
    experts_native,
    grouped_native_problem,
    wgrad_native,
)
from ..cuda.scaled_mm import NATIVE_CAPABILITY
from ..reference.quantize import check_quantize_args
from . import dense as dispatch

GROUPED_FORMATS = ("nvfp4", "mxfp8", "mxfp8_e5m2")  # the block formats grouped products run


def grouped_format_problem(fmt: str) -> str | None:
    """Why a grouped (experts) product cannot run in block format ``fmt`` (None where it can)."""
    if fmt in GROUPED_FORMATS:
        return None
    return f"grouped (experts) GEMMs run {', '.join(GROUPED_FORMATS)}, not {fmt}"


def group_bounds(offs: torch.Tensor, total: int) -> list[tuple[int, int]]:
    """(start, end) of each group from cumulative ends ``offs`` over a dim of size ``total`` (read on the host)."""
    ends = [int(e) for e in offs.tolist()]
    starts = [0] + ends[:-1]
    if any(e < s for s, e in zip(starts, ends)) or (ends and (ends[0] < 0 or ends[-1] > total)):
        raise ValueError(f"grouped_mm: offsets {ends} must be non-decreasing and within 0..{total}")
    return list(zip(starts, ends))


def quantize_row_groups(x: torch.Tensor, fmt: str | Format, offs: torch.Tensor, *, rounding: str = "rne",
                        seed: int = 0, step: torch.Tensor | int = 0, scale_mode: str = "rceil", rht: bool = False,
                        rht_signs: torch.Tensor | None = None, pad_k: bool = False,
                        amax: torch.Tensor | None = None) -> QuantizedGroups:
    """Each row group of 2D ``x`` (between the cumulative ends ``offs``) quantized along dim 1 on its own, as a
    grouped GEMM's token operand is: NVFP4 with the group's own tensor scale (1 for an empty group), SR bits from
    the stream ``sr_stream(group_seed(seed, g), step)``. Where Triton runs, every group in one launch (two more
    for NVFP4's amaxes), ``offs`` and ``step`` read on the device; elsewhere one quantization per group. Rows past
    the last offset hold codes no product reads. ``pad_k``: x as if zero-padded along dim 1 to whole blocks (the
    zeros made in the kernel where Triton runs, a padded copy elsewhere). ``amax``: NVFP4's static tensor amax
    (``dispatch.check_amax``) for every group, in place of each group's own."""
    if x.ndim != 2:
        raise ValueError(f"quantize_row_groups needs a 2D tensor, got shape {tuple(x.shape)}")
    fmt, kp = _checked_reduction(x, fmt, pad_k, rounding, False, scale_mode)
    dispatch.check_amax(amax, fmt, rht)
    if dispatch.use_triton(x.device, dispatch.quantize_supports(x, fmt)):
        from ..triton.quantize_grouped import quantize_row_groups_triton

        codes, scales, ts = quantize_row_groups_triton(x, fmt, offs, seed=seed if rounding == "sr" else None,
                                                       step=_device_step(step, x.device), scale_mode=scale_mode,
                                                       rht=rht, rht_signs_=rht_signs, k_padded=kp, amax=amax)
        return QuantizedGroups(fmt, codes, scales, ts, torch.Size((x.shape[0], kp)))
    x = zero_padded(x, 1, kp)
    bounds, step = group_bounds(offs, x.shape[0]), int(step)
    n_rows, k = x.shape
    codes = x.new_zeros(n_rows, k // 2 if fmt is NVFP4 else k, dtype=torch.uint8)
    scales = x.new_zeros(n_rows, k // fmt.block_size, dtype=torch.uint8)
    ts = x.new_ones(len(bounds), dtype=torch.float32) if fmt is NVFP4 else None
    for g, (s, e) in enumerate(bounds):
        if e > s:
            q = dispatch.quantize(x[s:e], fmt, 1, rounding=rounding, seed=sr_stream(group_seed(seed, g), step),
                                  scale_mode=scale_mode, rht=rht, rht_signs=rht_signs, amax=amax)
            codes[s:e], scales[s:e] = q.codes.view(torch.uint8), q.scales.view(torch.uint8)
            if ts is not None:
                ts[g] = q.tensor_scale
    codes, scales = (codes, scales.view(torch.float8_e4m3fn)) if fmt is NVFP4 else (codes.view(fmt.elem.torch_dtype),
                                                                                   scales)
    return QuantizedGroups(fmt, codes, scales, ts, x.shape)


def quantize_batches(x: torch.Tensor, fmt: str | Format, *, rounding: str = "rne", seed: int = 0,
                     step: torch.Tensor | int = 0, tile2d: bool = False, scale_mode: str = "rceil", rht: bool = False,
                     rht_signs: torch.Tensor | None = None, sr_of_transpose: bool = False,
                     pad_k: bool = False) -> QuantizedGroups:
    """Each item ``x[e]`` of a 3D (E, K, N) tensor (a grouped GEMM's expert weights) quantized along K on its own,
    as ``quantize_row_groups`` quantizes token groups (the item's own tensor scale and SR stream
    ``sr_stream(group_seed(seed, e), step)``): one Triton quantization of every item where Triton runs, else one
    per item. ``sr_of_transpose``: each item quantized as ``x[e]ᵀ`` (N, K) along its rows (SR bits keyed on its
    indices; the same codes layout): an (E, N, K) operand stored transposed, read where it lies. ``pad_k``: as
    ``quantize_row_groups``'s, along K."""
    if x.ndim != 3:
        raise ValueError(f"quantize_batches needs a 3D tensor, got shape {tuple(x.shape)}")
    if sr_of_transpose and tile2d:
        raise ValueError("quantize_batches: sr_of_transpose quantizes rows, which take no 16x16 tiles (tile2d)")
    fmt, kp = _checked_reduction(x, fmt, pad_k, rounding, tile2d, scale_mode)
    tile_rows = 16 if tile2d else 1
    if dispatch.use_triton(x.device, dispatch.quantize_supports(x, fmt)):
        from ..triton.quantize_grouped import quantize_batches_triton

        codes, scales, ts = quantize_batches_triton(x, fmt, seed=seed if rounding == "sr" else None,
                                                    step=_device_step(step, x.device), tile2d=tile2d,
                                                    scale_mode=scale_mode, rht=rht, rht_signs_=rht_signs,
                                                    sr_of_transpose=sr_of_transpose, k_padded=kp)
        return QuantizedGroups(fmt, codes, scales, ts, torch.Size((x.shape[0], kp, x.shape[2])), tile_rows)
    x = zero_padded(x, 1, kp)
    step = int(step)
    items = [dispatch.quantize(x[e].t() if sr_of_transpose else x[e], fmt, 1 if sr_of_transpose else 0,
                               rounding=rounding, seed=sr_stream(group_seed(seed, e), step), tile2d=tile2d,
                               scale_mode=scale_mode, rht=rht, rht_signs=rht_signs)
             for e in range(x.shape[0])]
    ts = None if fmt is not NVFP4 else torch.stack([q.tensor_scale for q in items])
    return QuantizedGroups(fmt, torch.stack([q.codes for q in items]), torch.stack([q.scales for q in items]), ts,
                           x.shape, tile_rows)


def _checked_reduction(x: torch.Tensor, fmt: str | Format, pad_k: bool, rounding: str, tile2d: bool,
                       scale_mode: str) -> tuple[Format, int]:
    """(format, K) of a grouped quantization along dim 1 of ``x`` (2D token rows, or 3D items (E, K, N)): K
    rounded up to whole blocks with ``pad_k``, and the arguments checked as for one item of that padded shape."""
    kp = whole_blocks(x.shape[1], get_format(fmt)) if pad_k else x.shape[1]
    item, axis = ((x.shape[0], kp), 1) if x.ndim == 2 else ((kp, x.shape[2]), 0)
    return check_quantize_args(x.new_empty(item, device="meta"), fmt, axis, rounding, tile2d, scale_mode), kp


def whole_blocks(k: int, fmt: Format) -> int:
    """``k`` rounded up to whole blocks of ``fmt``: the reduction the quantizers pad to (``pad_k``)."""
    return k + -k % fmt.block_size


def zero_padded(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``x`` zero-padded along ``dim`` to ``size`` (a copy), or ``x`` itself where it has that size already."""
    pad = size - x.shape[dim]
    return torch.nn.functional.pad(x, (0, 0) * (x.ndim - 1 - dim) + (0, pad)) if pad else x


def _device_step(step: torch.Tensor | int, device: torch.device) -> torch.Tensor:
    """The step as the int64 device scalar the grouped kernels read: a host int becomes a fill on the device (no
    copy from the host, so no wait)."""
    return step if isinstance(step, torch.Tensor) else torch.full((), step, dtype=torch.int64, device=device)


def grouped_gemm_path(capability: tuple[int, int] | None, layout: str, a: Operand, b: Operand,
                      out_dtype: torch.dtype, groups: int) -> tuple[str, str | None]:
    """How a quantized grouped (experts) GEMM of ``groups`` groups runs on a GPU of this compute capability (None:
    the Triton interpreter), given one group's operands or shape-only stand-ins (every group shares their formats
    and the dims not grouped), and why not natively: ``native_grouped``, ``decoded_grouped``, ``triton_grouped`` or
    ``per_group`` (see the module doc)."""
    mode = kernel_mode()
    if mode not in ("auto", "triton"):
        return "per_group", f"AUTOPREC_KERNELS={mode}"
    if layout not in ("2d3d", "2d2d") or out_dtype not in dispatch.KERNEL_OUT_DTYPES:
        return "per_group", (f"layout {layout} with out_dtype {out_dtype} (one launch multiplies 2d x 3d and 2d x 2d "
                             "products into float32 or bfloat16)")
    if capability is None or mode == "triton":
        return "triton_grouped", "the Triton interpreter" if capability is None else "AUTOPREC_KERNELS=triton"
    if capability[0] not in NATIVE_GROUPED_MAJORS:
        return "decoded_grouped", (f"sm_{capability[0]}{capability[1]}" + ("" if capability < NATIVE_CAPABILITY else
                                   " (torch's scaled_grouped_mm runs block-scaled groups on sm_100 only)"))
    why = dispatch.torch_api_problem("scaled_grouped_mm") or grouped_native_problem(layout, a, b, out_dtype, groups)
    return ("native_grouped", None) if why is None else ("decoded_grouped", why)


def wgrad_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, fmt: Format, path: str, out_dtype: torch.dtype, *,
             rounding_a: str, rounding_b: str, seeds: tuple[int, int], step: torch.Tensor | int, scale_mode: str,
             rht: bool, rht_signs: torch.Tensor | None) -> torch.Tensor:
    """The experts' wgrad (E, M, N) of ``a`` (M, T) and ``b`` (T, N), token groups ending at ``offs``, on ``path``
    (``grouped_route``'s): both operands quantized along the tokens by one K-grouped quantization each (each group
    zero-padded to whole blocks, its own tensor scale and SR stream), then one grouped GEMM (native, or Triton)."""
    from ..triton.grouped_mm import grouped_wgrad_decoded, grouped_wgrad_tc_triton
    from ..triton.quantize_k_groups import quantize_k_groups_triton

    ops = []
    for x, axis, rounding, seed in ((a, 1, rounding_a, seeds[0]), (b, 0, rounding_b, seeds[1])):
        codes, scales, ts, ends = quantize_k_groups_triton(
            x, fmt, axis, offs, seed=seed if rounding == "sr" else None, step=_device_step(step, x.device),
            scale_mode=scale_mode, rht=rht, rht_signs_=rht_signs)
        ops.append(Operand(fmt, codes, scales, ts, codes.shape[0], scales.shape[1] * fmt.block_size))
    if path == "native_grouped":
        return wgrad_native(*ops, ends, offs)
    run = grouped_wgrad_decoded if path == "decoded_grouped" else grouped_wgrad_tc_triton
    return run(*ops, ends, out_dtype)


def experts_operands(qa: QuantizedGroups, qb: QuantizedGroups) -> tuple[Operand, Operand]:
    """The one-launch kernels' operands: the (T, K) token rows, and the E experts' (N, K) operands one after the
    other (E·N rows); NVFP4's tensor scales one per group."""
    (t, k), (experts, _, n) = qa.shape, qb.shape
    a = Operand(qa.fmt, qa.codes, qa.scales, qa.tensor_scales, t, k)
    b = Operand(qb.fmt, qb.codes.reshape(experts * n, -1), qb.scales.reshape(-1, qb.scales.shape[-1]),
                qb.tensor_scales, experts * n, k, qb.tile_rows)
    return a, b


def experts_mm(qa: QuantizedGroups, qb: QuantizedGroups, offs: torch.Tensor | None, out_dtype: torch.dtype,
               path: str) -> torch.Tensor:
    """The experts' product (2d x 3d): token rows ``qa`` (T, K) in groups ending at ``offs`` (None: E groups of T / E
    rows, a batched product) times expert weights ``qb`` (E, K, N), group g's rows by expert g's weight -> (T, N),
    rows past the last offset zero; on ``path`` (``grouped_route``'s)."""
    (t, _), (experts, _, n) = qa.shape, qb.shape
    if path in ("decoded_grouped", "triton_grouped"):
        from ..triton.grouped_mm import grouped_mm_decoded, grouped_mm_tc_triton

        run = grouped_mm_decoded if path == "decoded_grouped" else grouped_mm_tc_triton
        return run(*experts_operands(qa, qb), experts, None if offs is None else offs.to(torch.int32), out_dtype)
    if offs is None:  # the equal groups' ends, made on the device
        size = t // experts
        offs = torch.arange(size, t + 1, size, device=qa.codes.device, dtype=torch.int32)
    if path == "native_grouped":
        return experts_native(qa, qb, offs)
    out = torch.zeros(t, n, device=qa.codes.device, dtype=out_dtype)
    for g, (s, e) in enumerate(group_bounds(offs, t)):
        if e > s:
            out[s:e] = dispatch.scaled_mm(qa.group(g, slice(s, e)), qb.group(g), None, out_dtype)
    return out
