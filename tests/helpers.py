"""Shared test helpers."""
from __future__ import annotations

from dataclasses import replace

import torch


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of ``approx`` against ``ref`` in dB."""
    ref, approx = ref.double(), approx.double()
    return float(10 * torch.log10(ref.pow(2).sum() / (approx - ref).pow(2).sum()))


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when two tensors hold the same bytes (NaN payloads and signed zeros included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def edge_tensor(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Random normal data with edge blocks: zero, Inf, -Inf, NaN, tiny (subnormal scales), saturating."""
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    x[0, :32] = 0.0
    x[1, 3] = float("inf")
    x[2, 40] = float("-inf")
    x[3, 7] = float("nan")
    x[4, :32] = 1e-30
    x[5, :32] *= 2.0**-20
    x[6, 0] = 3e38
    x[7, 33] = -0.0
    return x


def to_device(q, device):
    """A QuantizedTensor with its codes, scales and tensor scale moved to ``device``."""
    ts = None if q.tensor_scale is None else q.tensor_scale.to(device)
    return replace(q, codes=q.codes.to(device), scales=q.scales.to(device), tensor_scale=ts)
