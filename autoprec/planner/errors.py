"""The error numerics calibration scores with: exact products, errors normalized by the exact product's scale,
finiteness checks. Computed in fp32 (float64 where the range demands it) so scores do not depend on the data's
scale."""
from __future__ import annotations

import torch

from autoprec.formats import get_format
from autoprec.kernels.dispatch.grouped import group_bounds, grouped_format_problem

from .candidates import Candidate


def group_errors(y: torch.Tensor, exact: torch.Tensor, offs: torch.Tensor | None, layout: str) -> tuple[float, ...]:
    """The relative error |Ŷ-Y|²/|Y|² of each group's output (an expert's tokens, or its weight gradient)."""
    if layout == "2d3d":
        parts = [(y[s:e], exact[s:e]) for s, e in group_bounds(offs, y.shape[0])]
    else:
        parts = list(zip(y, exact))
    return tuple(ratio(dot(p - q, p - q), dot(q, q)) for p, q in parts)


def non_finite(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
                product: torch.Tensor | None = None) -> str | None:
    """Which operands hold NaN/Inf (None when all are finite). A finite fp32 sum proves every value
    finite (one fast pass); a sum that overflowed is checked again with min and max, which propagate NaN.
    A finite ``product`` (the graph's fp32 ``a @ b + bias``, when smaller than the operands) proves it
    too: a NaN or Inf in a row of ``a``, a column of ``b`` or the bias makes that row or column of the
    product NaN or Inf."""
    if (product is not None and 0 < product.numel() < a.numel() + b.numel() and a.shape[-1]
            and torch.isfinite(product.sum())):
        return None
    bad = [name for name, t in (("a", a), ("b", b), ("bias", bias))
           if t is not None and t.numel() and not torch.isfinite(t.sum())
           and not torch.isfinite(torch.stack(torch.aminmax(t))).all()]
    return f"calibration saw NaN/Inf in operand {' and '.join(bad)}" if bad else None


# products whose max lies in this range are compared in fp32 (their own rounding error, ~1e-7 relative,
# is far below any candidate's; 1/max is a normal fp32 number), others in float64
FP32_SCALES = (2.0**-100, 2.0**100)


def exact_product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
                   product: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b + bias`` from the fp32 operands (``product``: already computed in fp32 by the graph): in
    fp32 where its max lies in ``FP32_SCALES``, else in float64 (data near the ends of fp32's range,
    where an fp32 product would underflow or overflow)."""
    if product is not None:
        y = product.detach()  # the graph's output, bias included
    else:
        y = torch.matmul(a, b)
        y = y if bias is None else y + bias
    if y.numel() == 0 or FP32_SCALES[0] <= float(y.abs().max()) <= FP32_SCALES[1]:
        return y
    y = torch.matmul(a.double(), b.double())
    return y if bias is None else y + bias.double()


def normalized_error(y: torch.Tensor, scale: torch.Tensor, neg_exact: torch.Tensor) -> torch.Tensor:
    """``y / scale - exact`` (``neg_exact``: -exact, already divided by ``scale``), a new tensor in the exact's
    dtype: in fp32 one pass multiplying by 1/scale (a normal number there), in float64 a division."""
    if neg_exact.dtype == torch.float32:
        return torch.add(neg_exact, y.float(), alpha=1.0 / float(scale))
    return y.double().div_(scale).add_(neg_exact)


def blocked_copy(x: torch.Tensor, axis: int) -> torch.Tensor:
    """``x`` with its block axis contiguous in memory (same values, same shape): the candidates'
    quantizers then read it in place instead of each moving the axis themselves."""
    return x.movedim(axis, -1).contiguous().movedim(-1, axis)


def scale_of(t: torch.Tensor) -> torch.Tensor:
    """max|t| as a divisor (1 for an all-zero tensor): errors are measured on data scaled to max 1, in
    float64, so neither overflow (inputs near 1e20) nor underflow (near 1e-30) distorts them."""
    m = t.abs().max()
    return torch.where(m > 0, m, torch.ones_like(m))


def dot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Σ x·y over all elements in one pass (a BLAS dot in the operands' dtype)."""
    return torch.dot(x.reshape(-1), y.reshape(-1))


def ratio(num: torch.Tensor, den: torch.Tensor) -> float:
    """num / den as a float; 0 when both are 0, the numerator alone when there is no signal."""
    num, den = float(num), float(den)
    return num / den if den > 0 else num


def blockable(a: torch.Tensor, b: torch.Tensor, c: Candidate, weight_operand: int | None,
               layout: str | None = None) -> bool:
    """Whether candidate ``c`` can block these operands (square tiles: both dims of a 2D weight, or of
    each expert's weight; a grouped wgrad pads its token groups, so any K goes; FP8-block runs dense products only)."""
    f = get_format(c.fmt)
    if not f.quantized:
        return True
    if layout is not None and grouped_format_problem(f.name):
        return False
    k = a.shape[-1]
    if k % f.block_size and layout != "2d2d":
        return False
    if not c.tile2d:
        return True
    w = (a, b)[weight_operand] if weight_operand is not None else None
    ndim = 3 if layout is not None else 2
    return w is not None and w.ndim == ndim and all(s % f.tile == 0 for s in w.shape[-2:])
