"""What runs where: the one package that picks, per device and operand, the implementation of a quantization
or a product (dense, batched, grouped) and says why a faster one was not taken. See docs/kernels.md."""
from __future__ import annotations

import torch

from ..core.quantized import QuantizedTensor
from .batched import batched_scaled_mm
from .dense import dequantize, quantize
from .dense import scaled_mm as dense_scaled_mm


def scaled_mm(
    a: QuantizedTensor | torch.Tensor,
    b: QuantizedTensor | torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``a @ b (+ bias)`` for a (M, K) and b (K, N), each blocked along K, or batches of them (B, M, K) x
    (B, K, N); either may be a plain bfloat16 tensor. Accumulates in fp32 and rounds once to ``out_dtype``."""
    route = batched_scaled_mm if len(a.shape) == 3 else dense_scaled_mm
    return route(a, b, bias, out_dtype)


__all__ = ["dequantize", "quantize", "scaled_mm"]
