"""Reference random Hadamard transform (RHT) in tiles of 16 along one axis.

M = H16 / 4 · diag(signs) is orthogonal, so (M a)ᵀ(M b) = aᵀb. The product is computed in one fixed order, so
that the fused C and Triton versions match it bit for bit: the signs first (exact; then + 0, so a zero is +0 and no
output is -0), then the fast Walsh-Hadamard transform's four butterfly stages (pairs i, i + h for h = 1, 2, 4, 8:
a + b, a - b, each rounded once in fp32), then the exact ·1/4. Four additions per element where a row of H16 takes
sixteen, each output a balanced sum of depth 4 (a smaller error bound than a sequential sum of 16 terms).
"""
from __future__ import annotations

import functools

import torch

from ..core.quantized import normalize_axis

TILE = 16
DEFAULT_RHT_SEED = 0


def rht_signs(seed: int = DEFAULT_RHT_SEED) -> torch.Tensor:
    """The run's fixed ±1 sign vector of length 16, reproducible from ``seed`` (a copy: every quantize
    with the RHT asks for it, and drawing it anew each time costs more than the copy)."""
    return _signs(seed).clone()


@functools.cache
def _signs(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (TILE,), generator=gen).to(torch.float32) * 2 - 1


def rht_ref(x: torch.Tensor, axis: int, signs: torch.Tensor | None = None) -> torch.Tensor:
    """Apply the RHT to fp32 copies of ``x`` in consecutive 16-tiles along ``axis``."""
    axis = normalize_axis(axis, x.ndim)
    if x.shape[axis] % TILE:
        raise ValueError(
            f"RHT: dim {axis} of shape {tuple(x.shape)} has size {x.shape[axis]}, not a multiple of {TILE}"
        )
    s = (rht_signs() if signs is None else signs).to(device=x.device, dtype=torch.float32)
    t = x.to(torch.float32).movedim(axis, -1).unflatten(-1, (-1, TILE)) * s + 0.0  # -0 -> +0: zeros stay +0
    h = 1
    while h < TILE:  # butterflies of pairs (i, i + h): [.., 16] as [.., 16 / 2h, 2, h]
        pairs = t.unflatten(-1, (TILE // (2 * h), 2, h))
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        t = torch.stack((a + b, a - b), -2).flatten(-3)
        h *= 2
    return (t * 0.25).flatten(-2).movedim(-1, axis)
