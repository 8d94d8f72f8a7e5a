"""A hand-written eager reference for compiled linear layers: each GEMM quantized as autoprec plans it."""
from __future__ import annotations

import torch

from autoprec.kernels import quantize, scaled_mm


def gemm(a: torch.Tensor, b: torch.Tensor, fmt: str, bias: torch.Tensor | None = None,
         weight_b: bool = False) -> torch.Tensor:
    """a @ b (+ bias) with both operands in ``fmt`` blocked along the reduction dim (bf16: cast); ``weight_b``: b is
    the layer's weight, which takes FP8-block's 128x128 tiles (the recipe's weights)."""
    if fmt == "bf16":
        return scaled_mm(a.to(torch.bfloat16), b.to(torch.bfloat16), bias, out_dtype=a.dtype)
    tiles = weight_b and fmt == "fp8_block"
    return scaled_mm(quantize(a, fmt, -1), quantize(b, fmt, -2, tile2d=tiles), bias, out_dtype=a.dtype)


class QLinear(torch.autograd.Function):
    """y = x·Wᵀ + b with fprop X·Wᵀ, dgrad dY·W and wgrad dYᵀ·X each in ``fmt`` (RTN)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, fmt: str) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.fmt, ctx.has_bias = fmt, b is not None
        return gemm(x, w.t(), fmt, b, weight_b=True)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, w = ctx.saved_tensors
        dx = gemm(dy, w, ctx.fmt, weight_b=True) if ctx.needs_input_grad[0] else None
        dw = gemm(dy.t(), x, ctx.fmt)
        db = dy.sum(0) if ctx.has_bias else None
        return dx, dw, db, None


def qlinear(x: torch.Tensor, layer: torch.nn.Linear, fmt: str) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    return QLinear.apply(flat, layer.weight, layer.bias, fmt).view(*x.shape[:-1], -1)
