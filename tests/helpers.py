"""Shared test helpers."""
from __future__ import annotations

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
