"""Matmul operands in the (rows, K) storage layout the block-scaled matmul consumes."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from autoprec.formats import BF16, FP8_BLOCK, NVFP4, Format

from .quantized import QuantizedTensor

KIND_NVFP4, KIND_MXFP8, KIND_BF16 = 0, 1, 2
KIND_BF16_SCALED = 3  # the kernels' kind of bf16 values with a tensor scale (an NVFP4 operand decoded to bf16)
KIND_FP8_BLOCK = 4  # fp32 block scales: cuBLAS's blockwise GEMM or the reference reads them, no Triton kernel
KERNEL_OUT_DTYPES = (torch.float32, torch.bfloat16)  # what the matmul kernels write


@dataclass(frozen=True)
class Operand:
    """One GEMM operand stored (rows, K) with K the reduction axis: a quantized tensor blocked along
    K, or plain bfloat16 values (a view, possibly strided: the kernels take a contiguous copy), which may carry an
    NVFP4 tensor scale for the product to take (``decoded``)."""

    fmt: Format
    codes: torch.Tensor
    scales: torch.Tensor | None
    tensor_scale: torch.Tensor | None
    rows: int
    k: int
    tile_rows: int = 1

    @property
    def kind(self) -> int:
        if self.fmt is BF16:
            return KIND_BF16
        if self.fmt is FP8_BLOCK:
            return KIND_FP8_BLOCK
        return KIND_NVFP4 if self.fmt is NVFP4 else KIND_MXFP8


def as_operand(x: QuantizedTensor | torch.Tensor, k_axis: int, name: str) -> Operand:
    """Wrap a 2D matmul operand whose reduction axis is ``k_axis`` (1 for A of A·B, 0 for B)."""
    if isinstance(x, QuantizedTensor):
        if len(x.shape) != 2 or x.axis != k_axis:
            raise ValueError(
                f"scaled_mm: operand {name} must be 2D and blocked along its reduction dim {k_axis}, "
                f"got shape {tuple(x.shape)} blocked along dim {x.axis}"
            )
        rows, k = x.shape[1 - k_axis], x.shape[k_axis]
        return Operand(x.fmt, x.codes, x.scales, x.tensor_scale, rows, k, x.tile_rows)
    if not isinstance(x, torch.Tensor) or x.ndim != 2 or x.dtype != torch.bfloat16:
        raise TypeError(f"scaled_mm: operand {name} must be a QuantizedTensor or a 2D bfloat16 tensor")
    stored = x if k_axis == 1 else x.t()  # made contiguous only where a kernel reads it (kernel_args)
    return Operand(BF16, stored, None, None, stored.shape[0], stored.shape[1])


def decoded(op: Operand, values: torch.Tensor) -> Operand:
    """The bf16 operand of ``op``'s decoded ``values`` (code times block scale), carrying NVFP4's tensor scale."""
    return Operand(BF16, values, None, op.tensor_scale if op.fmt is NVFP4 else None, op.rows, op.k)


def kernel_args(op: Operand) -> tuple[list[torch.Tensor], list]:
    """Pointers and constexprs (kind, element bits, bias, Inf) describing one operand to the Triton matmuls."""
    elem = op.fmt.elem
    if op.kind == KIND_BF16:
        codes = op.codes.contiguous()
        if op.tensor_scale is not None:
            return [codes, codes, op.tensor_scale], [KIND_BF16_SCALED, 0, 0, 0, False]
        return [codes, codes, codes], [KIND_BF16, 0, 0, 0, False]
    ts = op.tensor_scale if op.tensor_scale is not None else op.codes
    ptrs = [op.codes.view(torch.uint8), op.scales.view(torch.uint8), ts]
    return ptrs, [op.kind, elem.ebits, elem.mbits, elem.bias, elem.torch_dtype == torch.float8_e5m2]
