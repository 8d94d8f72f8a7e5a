"""Unquantized grouped products (``exact`` on bf16 operands, or ``bf16``) on torch's own grouped GEMM,
``aten._grouped_mm``, where it runs its CUTLASS kernel with the offsets read on the device: a GPU of compute
capability 9.x or 10.x (torch's check), bf16 operands and output, every operand in a layout of 16-byte aligned
strides. Elsewhere torch's op loops over the groups with their bounds read on the host, as ``grouped_mm``'s own
loop does.

Where no group writes, torch's output is undefined: the rows past the last offset of a 2d x 3d product, and an
empty group's 2d x 2d product (sm_100's kernel leaves non-zeros there, pytorch/pytorch#172439). Both are zeroed
on the device, so the product keeps ``grouped_mm``'s contract without reading the offsets.
"""
from __future__ import annotations

import torch

from ..core.group_offsets import zero_unwritten
from ..core.mode import kernel_mode

TORCH_GROUPED_MAJORS = (9, 10)  # compute capability majors where aten._grouped_mm runs CUTLASS on bf16
TORCH_MAX_GROUPS = 1023  # torch's grouped GEMMs (bf16 and block-scaled) refuse 1024 groups or more
ALIGN = 8  # elements: 16 bytes of bf16, for the strides and start of every operand


def jagged_dims(layout: str) -> tuple[int | None, int | None]:
    """The dim of a and of b that the offsets cut (None: an operand with a dim per group)."""
    return {"2d3d": (-2, None), "2d2d": (-1, -2), "3d3d": (None, None)}[layout]


def torch_grouped_problem(capability: tuple[int, int] | None, layout: str, exact: bool,
                          dtypes: tuple[torch.dtype, ...], out_dtype: torch.dtype, shapes: tuple[tuple, ...],
                          groups: int) -> str | None:
    """Why torch's grouped GEMM would not run an unquantized product (``exact``: in the operands' dtype, else in
    bf16) of operands of these dtypes and shapes in ``groups`` groups with the offsets on the device; None where it
    does."""
    if capability is None or capability[0] not in TORCH_GROUPED_MAJORS:
        return "torch's grouped GEMM runs its kernel on sm_90 and sm_100 only"
    if kernel_mode() != "auto":
        return f"AUTOPREC_KERNELS={kernel_mode()}"
    if out_dtype != torch.bfloat16 or exact and any(d != torch.bfloat16 for d in dtypes):
        return f"operands {dtypes} and output {out_dtype}: torch's grouped GEMM takes bf16 only"
    if too_many_groups(groups):
        return too_many_groups(groups)
    if not all(_alignable(shape, jagged) for shape, jagged in zip(shapes, jagged_dims(layout))):
        return f"shapes {[tuple(s) for s in shapes]}: no layout with strides of whole 16 bytes"
    return None


def too_many_groups(groups) -> str | None:
    """Why torch's grouped GEMMs would refuse this many groups (a symbolic count: it may be too many), or None."""
    if not isinstance(groups, int) or groups > TORCH_MAX_GROUPS:
        return f"{groups} groups (torch's grouped GEMMs take at most {TORCH_MAX_GROUPS})"
    return None


def torch_grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None, layout: str) -> torch.Tensor:
    """``aten._grouped_mm`` of ``a`` and ``b`` cast to bf16 (copied to an aligned layout where theirs is not),
    with the output torch leaves undefined zeroed (see the module doc); ``layout`` as in ``grouped.grouped_mm``."""
    a, b = (_aligned(x.to(torch.bfloat16), jagged) for x, jagged in zip((a, b), jagged_dims(layout)))
    offs = None if offs is None else offs.to(torch.int32)
    return zero_unwritten(torch._grouped_mm(a, b, offs, out_dtype=torch.bfloat16), offs, layout)


def _multiple(d) -> bool:
    """Whether size ``d`` is known (not symbolic) to be a whole number of 16 bytes of bf16."""
    return isinstance(d, int) and d % ALIGN == 0


def _alignable(shape: tuple, jagged: int | None) -> bool:
    """Whether an operand of this shape has a dense layout torch's kernel takes with every group's start aligned:
    the dim the offsets cut (``jagged``) the strided one, so the other dim, unit-stride, must be whole 16 bytes;
    either dim where no offsets cut it."""
    if jagged is None:
        return _multiple(shape[-1]) or _multiple(shape[-2])
    return _multiple(shape[-1] if jagged == -2 else shape[-2])


def _fits(x: torch.Tensor, jagged: int | None) -> bool:
    """Whether torch's kernel takes ``x`` as laid out: one of its last two dims unit-stride (not the jagged one),
    the other's stride whole 16 bytes and past the span of the unit-stride dim (as aten checks), a batch stride
    of whole 16 bytes, and a 16-byte aligned start."""
    (r, c), (sr, sc) = x.shape[-2:], x.stride()[-2:]
    if sc == 1 and sr >= max(1, c) and jagged != -1:
        lead = sr
    elif sr == 1 and sc >= max(1, r) and jagged != -2:
        lead = sc
    else:
        return False
    batch = x.stride(0) % ALIGN == 0 if x.ndim == 3 else True
    return lead % ALIGN == 0 and batch and x.data_ptr() % (2 * ALIGN) == 0


def _aligned(x: torch.Tensor, jagged: int | None) -> torch.Tensor:
    """``x`` itself where torch's kernel takes its layout, else a dense copy it takes (``_alignable``): row-major
    where its rows are whole 16 bytes and the offsets do not cut its columns, else column-major."""
    if _fits(x, jagged):
        return x
    if _multiple(x.shape[-1]) and jagged != -1:
        return x.clone(memory_format=torch.contiguous_format)
    return x.mT.clone(memory_format=torch.contiguous_format).mT
