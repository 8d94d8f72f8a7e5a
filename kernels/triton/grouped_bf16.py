"""Unquantized experts GEMMs (``exact`` on bf16 operands, or ``bf16``) in one Triton launch, the offsets read on
the device, where torch's grouped GEMM would loop over the groups on the host: GPUs other than sm_90 / sm_100
(sm_80, sm_89, sm_120), and an fp32 output, which torch's kernel does not write. The kernels (Triton is imported
only where they run) take fp32 accumulation and one rounding to the output dtype, each group's product equal to
``torch.mm`` of that group up to accumulation order.

- 2d x 3d: ``grouped_mm_triton``'s one-launch kernel on bf16 tiles (what its decoded path multiplies): the (T, K)
  token rows as they are, every expert's (N, K) weight one after the other (a copy unless the weights are stored
  (E, N, K)); rows past the last offset written as zeros.
- 3d x 3d (a batch): the items' (M, K) rows one after the other, as equal token groups of the 2d x 3d kernel.
- 2d x 2d (wgrad): ``wgrad_bf16_triton``'s kernel, both operands read where they lie, each group's K loop over its
  own tokens; an empty group's gradient is zero.
"""
from __future__ import annotations

import torch

from autoprec.formats import BF16

from ..core.operand import KERNEL_OUT_DTYPES, Operand

BF16_MMA_CAPABILITY = (8, 0)  # the first compute capability with bf16 tensor-core MMA


def bf16_grouped_problem(capability: tuple[int, int] | None, exact: bool, dtypes: tuple[torch.dtype, torch.dtype],
                         out_dtype: torch.dtype) -> str | None:
    """Why the one-launch bf16 kernels do not run an unquantized grouped product of any layout (``exact``: in the
    operands' dtype, else in bf16) on a GPU of this capability (None: the Triton interpreter), where Triton runs;
    None where they do."""
    if capability is not None and capability < BF16_MMA_CAPABILITY:
        return f"sm_{capability[0]}{capability[1]} has no bf16 tensor-core MMA"
    if exact and any(d != torch.bfloat16 for d in dtypes):
        return f"exact operands {dtypes} (the kernels multiply bf16)"
    if out_dtype not in KERNEL_OUT_DTYPES:
        return f"out_dtype {out_dtype} (the kernels write float32 or bfloat16)"
    return None


def bf16_grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None, layout: str,
                    out_dtype: torch.dtype) -> torch.Tensor:
    """The grouped product (``grouped.grouped_mm``'s ``layout``) of ``a`` and ``b`` cast to bf16, in one launch;
    ``bf16_grouped_problem`` is None for it."""
    from .grouped_mm import BF16_BLOCKS, BF16_OPTIONS, bf16_dot, launch_grouped

    a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
    if layout in ("2d3d", "3d3d"):
        (experts, k, n), rows = b.shape, a.reshape(-1, a.shape[-1]).contiguous()
        stacked = b.transpose(1, 2).contiguous().view(experts * n, k)  # each expert's (N, K)
        out = torch.empty(rows.shape[0], n, device=a.device, dtype=out_dtype)
        launch_grouped(_operand(rows), _operand(stacked), None, None, out, bf16_dot(), BF16_BLOCKS, experts=experts,
                       offs=None if offs is None else offs.to(torch.int32), **BF16_OPTIONS)
        return out.view(*a.shape[:-1], n)
    from .wgrad_bf16 import bf16_wgrad

    return bf16_wgrad(a, b, offs.to(torch.int32), out_dtype)


def _operand(x: torch.Tensor) -> Operand:
    """A contiguous (rows, K) bf16 operand of the kernels."""
    return Operand(BF16, x, None, None, x.shape[0], x.shape[1])
