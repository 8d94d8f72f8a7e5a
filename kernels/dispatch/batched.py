"""Batched block-scaled products, (B, M, K) · (B, K, N) -> (B, M, N): planned ``bmm`` nodes (eager attention's two
GEMMs, experts run as a batched matmul over each token's gathered weights).

Where Triton runs (a GPU; the interpreter under ``AUTOPREC_KERNELS=triton``), two quantized operands run as one
grouped GEMM (``grouped_dispatch.experts_mm``): a's B items are B token groups of M rows, b's items the B
"experts". It takes the path ``grouped_gemm_path`` picks for the experts' 2d x 3d product (sm_100's native grouped
GEMM, given the equal group ends made on the device, for batches up to torch's 1023 groups; else the one-launch
Triton GEMM, sm_90's decoded one or the in-register one, whose tiles find their equal groups by division), each
group under the operand's one tensor scale. Two bf16 operands run torch's batched matmul accumulating in fp32. So a
bmm is one GEMM launch, whatever its batch (an fp16 output is that launch's fp32 product, which
``dispatch.scaled_mm`` rounds once). A bf16 operand beside a quantized one runs one dense ``dispatch.scaled_mm`` per
item, as does an FP8-block pair (sm_90's blockwise GEMM has no grouped form in torch). Elsewhere (the CPU) it is
the reference: one fp32 batched matmul of the dequantized values. Every way equals
the reference up to fp32 accumulation order.
"""
from __future__ import annotations

import torch

from autoprec.formats import FP8_BLOCK

from ..core.operand import Operand
from ..core.quantized import QuantizedGroups, QuantizedTensor
from . import dense as dispatch
from . import grouped as grouped_dispatch

Batched = QuantizedTensor | torch.Tensor


def batched_scaled_mm(a: Batched, b: Batched, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """``a @ b (+ bias)`` for a (B, M, K) blocked along K and b (B, K, N) blocked along K (either may be plain
    bfloat16): fp32 accumulation, bias added in fp32, one rounding to ``out_dtype`` (module doc for where each
    runs; an ``out_dtype`` the kernels do not write, float16, is their fp32 product rounded once)."""
    if dispatch.kernel_out_dtype(out_dtype) != out_dtype:
        return batched_scaled_mm(a, b, bias, torch.float32).to(out_dtype)
    (batch, m, k), (n,) = _check(a, b, bias)
    device = (a.codes if isinstance(a, QuantizedTensor) else a).device
    if not dispatch.use_triton(device, None) or 0 in (batch, m, k, n):
        return dispatch.reference_scaled_mm(a, b, bias, out_dtype)
    wide = torch.float32 if bias is not None else out_dtype  # the product before the bias, where there is one
    if isinstance(a, QuantizedTensor) and isinstance(b, QuantizedTensor) and FP8_BLOCK not in (a.fmt, b.fmt):
        stand_ins = Operand(a.fmt, None, None, None, m, k), Operand(b.fmt, None, None, None, n, k)
        path, _ = grouped_dispatch.grouped_gemm_path(dispatch.device_capability(device), "2d3d", *stand_ins, wide,
                                                     batch)
        if path != "per_group":
            y = grouped_dispatch.experts_mm(_token_groups(a), _items(b), None, wide, path).view(batch, m, n)
            return _add_bias(y, bias, out_dtype)
    elif not isinstance(a, QuantizedTensor) and not isinstance(b, QuantizedTensor):
        y = torch.bmm(a, b, out_dtype=torch.float32) if a.is_cuda else torch.bmm(a.float(), b.float())
        return _add_bias(y, bias, out_dtype)
    return torch.stack([dispatch.scaled_mm(_item(a, i), _item(b, i), bias, out_dtype) for i in range(batch)])


def _check(a: Batched, b: Batched, bias: torch.Tensor | None) -> tuple[tuple[int, int, int], tuple[int]]:
    """(B, M, K) and (N,) of matching batched operands, blocked along K; raises naming what does not match."""
    a_shape, b_shape = tuple(a.shape), tuple(b.shape)
    if len(a_shape) != 3 or len(b_shape) != 3 or a_shape[0] != b_shape[0] or a_shape[2] != b_shape[1]:
        raise ValueError(f"scaled_mm: batched shapes {a_shape} @ {b_shape} do not match")
    for name, x, axis in (("a", a, 2), ("b", b, 1)):
        if isinstance(x, QuantizedTensor) and x.axis != axis:
            raise ValueError(f"scaled_mm: batched operand {name} must be blocked along its reduction dim {axis}, "
                             f"got dim {x.axis}")
        if not isinstance(x, QuantizedTensor) and x.dtype != torch.bfloat16:
            raise TypeError(f"scaled_mm: batched operand {name} must be a QuantizedTensor or bfloat16, got {x.dtype}")
    if bias is not None and tuple(bias.shape) != (b_shape[2],):
        raise ValueError(f"scaled_mm: bias must have shape ({b_shape[2]},), got {tuple(bias.shape)}")
    return a_shape, (b_shape[2],)


def _group_scales(q: QuantizedTensor, groups: int) -> torch.Tensor | None:
    """NVFP4's one tensor scale, once per group as the grouped GEMMs read them (None for MXFP8)."""
    return None if q.tensor_scale is None else q.tensor_scale.float().reshape(1).expand(groups).contiguous()


def _token_groups(a: QuantizedTensor) -> QuantizedGroups:
    """a (B, M, K) as B token groups of M rows: its storage, (B·M, ...) rows."""
    batch, m, k = a.shape
    return QuantizedGroups(a.fmt, a.codes.reshape(batch * m, -1), a.scales.reshape(batch * m, -1),
                           _group_scales(a, batch), torch.Size((batch * m, k)))


def _items(b: QuantizedTensor) -> QuantizedGroups:
    """b (B, K, N) as B experts' weights: its storage is already (B, N, ...) per item."""
    return QuantizedGroups(b.fmt, b.codes, b.scales, _group_scales(b, b.shape[0]), b.shape)


def _add_bias(y: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """The bias added to the fp32 product, then one rounding (nothing to do without a bias)."""
    return (y if bias is None else y.float() + bias.float()).to(out_dtype)


def _item(x: Batched, i: int) -> Batched:
    """Batch item ``i`` as a 2D operand."""
    if not isinstance(x, QuantizedTensor):
        return x[i]
    return QuantizedTensor(x.fmt, x.codes[i], x.scales[i], x.tensor_scale, x.axis - 1, x.shape[1:], x.tile_rows)
