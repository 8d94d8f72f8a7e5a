"""How a grouped (experts) product runs, decided once. ``grouped_route`` names the route ``grouped.grouped_mm``
takes and, from the same decision, whether that route reads a device value on the host (group bounds, the SR
step, MXFP8 scales): a CUDA graph cannot capture such a read. ``grouped_mm`` runs the route; the rewrite (which op
it emits) and the op inside a capture (whether to refuse) read its ``host_read``. So what runs and what the graph
was told cannot drift apart. The decision takes only what a compiled graph knows: the device, the operands' dtypes
and shapes, and the op's arguments.

Routes (``kind``):

- ``torch``: an unquantized product on torch's grouped GEMM (``grouped_torch``), offsets read on the device.
- ``triton_bf16``: an unquantized product torch's kernel does not take (GPUs but sm_90 / sm_100, an fp32 output)
  in one Triton launch on bf16 tiles (``grouped_bf16_triton``), offsets read on the device.
- ``loop``: any other unquantized product, one GEMM per group with the bounds read on the host (per batch item for
  3d x 3d, which has no bounds to read).
- ``experts``: a quantized 2d x 3d product, or a 3d x 3d one (its batch items' rows taken as equal token groups),
  its reduction zero-padded to whole blocks where it is not: the grouped quantizers (every token group in one
  launch, every expert in one; group by group where Triton does not run), then ``grouped_dispatch.experts_mm`` on
  ``path``.
- ``wgrad``: a quantized 2d x 2d product where Triton runs: one K-grouped quantization per operand, then one
  grouped GEMM on ``path`` (``grouped_dispatch.wgrad_mm``).
- ``per_group``: any other quantized product, each group quantized and multiplied on its own.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from autoprec.formats import NVFP4, Format, get_format

from ..core.group_offsets import GROUP_PAD
from ..core.operand import Operand
from ..cuda.grouped_bf16 import torch_grouped_problem
from ..triton.grouped_bf16 import bf16_grouped_problem
from . import dense as dispatch
from . import grouped as grouped_dispatch

EXACT = "exact"  # the product in the operands' dtype, as the traced op computes it
ANY_TOKENS = 1  # stands in for the token count, which picks no path (an empty product returns before routing)


@dataclass(frozen=True)
class GroupedRoute:
    """A grouped product's route (module doc): ``kind``; ``path``, the grouped GEMM's path for ``experts`` and
    ``wgrad`` (``grouped_dispatch.grouped_gemm_path``); ``why``, why not a faster path or route (None where
    none); ``host_read``, why it reads a device value on the host (None where it reads none)."""

    kind: str
    path: str | None
    why: str | None
    host_read: str | None


def grouped_route(device: torch.device, layout: str, fmt: str, dtypes: tuple[torch.dtype, torch.dtype],
                  shapes: tuple[tuple, tuple], groups: int, tile2d_b: bool, out_dtype: torch.dtype) -> GroupedRoute:
    """The route of ``grouped.grouped_mm`` in ``fmt`` on operands of these dtypes and shapes (sizes may be symbolic:
    a route that needs a size it cannot read takes the per-group one), in ``groups`` groups, on ``device``. Off a
    CUDA device every route reads the host ("not a CUDA device"). Outside ``exact``, an output dtype the kernels do
    not write (float16) routes as their float32 product, which ``grouped_mm`` then rounds once."""
    capability = dispatch.device_capability(device)
    if fmt != EXACT:
        out_dtype = dispatch.kernel_out_dtype(out_dtype)
    if fmt == EXACT or not get_format(fmt).quantized:
        why = torch_grouped_problem(capability, layout, fmt == EXACT, dtypes, out_dtype, shapes, groups)
        if why is None:
            route = GroupedRoute("torch", None, None, None)
        elif (triton := bf16_grouped_problem(capability, fmt == EXACT, dtypes, out_dtype)
              or dispatch.triton_problem(device, None)) is None:
            route = GroupedRoute("triton_bf16", None, why, None)
        else:  # a 3d x 3d batch has no bounds to read
            why = f"{why}; {triton}"
            route = GroupedRoute("loop", None, why, None if layout == "3d3d" else
                                 f"a {fmt} grouped product runs one GEMM per group: {why}")
    else:
        route = _quantized_route(device, capability, layout, get_format(fmt), dtypes, shapes, groups, tile2d_b,
                                 out_dtype)
    if capability is None:
        return GroupedRoute(route.kind, route.path, route.why, "not a CUDA device")
    return route


def _quantized_route(device: torch.device, capability: tuple[int, int] | None, layout: str, fmt: Format,
                     dtypes: tuple[torch.dtype, torch.dtype], shapes: tuple[tuple, tuple], groups: int, tile2d_b: bool,
                     out_dtype: torch.dtype) -> GroupedRoute:
    a_shape, b_shape = shapes
    if layout == "3d3d":  # a batch: its items' rows are equal token groups of a 2d x 3d product
        layout, a_shape = "2d3d", (ANY_TOKENS, a_shape[2])
    # the sizes a path depends on (not the token count, which is often symbolic): K and N, or a wgrad's M and N
    read = (a_shape[1], b_shape[2]) if layout == "2d3d" else (a_shape[0], b_shape[1])
    if not all(isinstance(d, int) for d in read):
        why = f"symbolic sizes {read} run per group"
        return GroupedRoute("per_group", None, why, why)
    quantizers = next(filter(None, (dispatch.quantize_dtype_problem(d) for d in dtypes)), None)
    if layout == "2d3d":
        k = grouped_dispatch.whole_blocks(a_shape[1], fmt)  # a reduction that is not whole blocks is zero-padded
        quantizers = dispatch.triton_problem(device, quantizers)
        tile_rows = 16 if tile2d_b else 1
        a, b = Operand(fmt, None, None, None, ANY_TOKENS, k), Operand(fmt, None, None, None, b_shape[2], k, tile_rows)
        path, why = _gemm_path(device, capability, layout, a, b, out_dtype, groups)
        read = (quantizers and f"the token groups are quantized one by one: {quantizers}"
                or _gemm_host_read(path, why, fmt, capability))
        return GroupedRoute("experts", path, quantizers or why, read)
    if tile2d_b:
        why = "a 2d x 2d product with 16x16 tiles runs per group"
        return GroupedRoute("per_group", None, why, why)
    why = dispatch.triton_problem(device, quantizers)
    if why is None:  # the K-grouped quantizers pad every group to whole multiples of GROUP_PAD tokens
        a, b = (Operand(fmt, None, None, None, rows, GROUP_PAD) for rows in (a_shape[0], b_shape[1]))
        path, why = grouped_dispatch.grouped_gemm_path(capability, layout, a, b, out_dtype, groups)
        if path != "per_group":
            return GroupedRoute("wgrad", path, why, _gemm_host_read(path, why, fmt, capability))
    why = f"a 2d x 2d product runs per group: {why}"
    return GroupedRoute("per_group", None, why, why)


def _gemm_path(device: torch.device, capability: tuple[int, int] | None, layout: str, a: Operand, b: Operand,
               out_dtype: torch.dtype, groups: int) -> tuple[str, str | None]:
    """The grouped GEMM's path of quantized groups: ``grouped_gemm_path``'s on a GPU or where Triton runs, else
    ``per_group`` (the CPU's reference kernels)."""
    if capability is None:
        why = dispatch.triton_problem(device, dispatch.scaled_mm_supports(a, b))
        if why is not None:
            return "per_group", why
    return grouped_dispatch.grouped_gemm_path(capability, layout, a, b, out_dtype, groups)


def _gemm_host_read(path: str, why: str | None, fmt: Format, capability: tuple[int, int] | None) -> str | None:
    """Why the grouped GEMM on ``path`` reads the host: ``per_group`` reads the bounds; the in-register Triton
    kernel (``triton_grouped``) checks MXFP8 scales against bf16's range on the host."""
    if path == "per_group":
        return f"the quantized groups are multiplied one by one: {why}"
    if path == "triton_grouped" and capability is not None and fmt is not NVFP4:  # MXFP8's E8M0 scales
        return f"{why}: the in-register kernel checks {fmt.name}'s scales on the host"
    return None
