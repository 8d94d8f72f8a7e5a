"""Stochastic rounding's random bits: a counter-based hash of (stream, element index).

The bits of element ``i`` of a quantization are ``hash(stream, i)``, with ``i`` the element's row-major
index in the tensor's own layout. Being a pure function of integers, the same bits come out on CPU and
GPU, in torch and in a kernel that computes them in place (the fused C quantizer does: no random-number
state, no pass over memory). The hash is Wellons' ``lowbias32`` finaliser applied twice; in torch every
product is formed from 16-bit halves, so int64 arithmetic stays exact (no signed overflow).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

SR_BITS = 24  # random bits consumed per stochastically rounded value
M32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9


def sr_stream(seed: int, step: int) -> int:
    """The stream of one quantization: the GEMM operand's ``seed`` (< 2**32) and the model's call
    counter ``step`` (< 2**32) packed into one 64-bit integer, so no two (GEMM, step) pairs share bits."""
    return (seed << 32) | (step & M32)


@dataclass(frozen=True)
class StepStream:
    """The stream ``sr_stream(seed, step)`` whose ``step`` (the model's call counter) is a 0-d int64 tensor,
    on the quantized tensor's device: the Triton quantizers read it there, so nothing waits for the GPU and a
    CUDA graph replays with each step's own bits. ``int()`` is the stream, read on the host."""

    seed: int
    step: torch.Tensor

    def __int__(self) -> int:
        return sr_stream(self.seed, int(self.step))

    def seed_key(self) -> int:
        """mix32 of the stream's high word (its seed): ``stream_keys`` with the step's low word, as a kernel
        holding the step computes it, is ``k1 = mix32(step ^ seed_key)``, ``k2 = mix32(k1 ^ GOLDEN)``."""
        return _seed_key(self.seed & M32)


def group_seed(seed: int, group: int) -> int:
    """The operand seed of group ``group`` of a grouped GEMM (one expert's tokens or weight): each group is
    quantized on its own, so each draws its own stream. Its key (mix32 of it) is the operand's key XOR a hash
    of the group, so ``offset_seed`` commutes with it: a grouped GEMM in a shared graph draws its groups' bits
    too."""
    return offset_seed(seed, mix32((group + GOLDEN) & M32))


def offset_seed(seed: int, offset: int) -> int:
    """The seed whose key (mix32 of it) is ``seed``'s XOR ``offset`` (< 2**32). The keys of a stream hash its
    step's low word XOR its seed's key, so ``sr_stream(offset_seed(seed, offset), step ^ offset)`` draws the bits
    of ``sr_stream(seed, step)``: a graph whose step input carries a per-module ``offset`` (one compiled graph run
    by several identical blocks, backend.py) holds seeds that are the same for every block."""
    return inv_mix32(mix32(seed & M32) ^ offset)


def _mul32(x, c: int):
    """``(x * c) mod 2**32`` for ``x`` in [0, 2**32) without an intermediate above 2**49."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & M32


def mix32(x):
    """lowbias32: a bijection of [0, 2**32) with strong avalanche (ints or int64 tensors)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x21F0AAAD)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x735A2D97)
    return x ^ (x >> 15)


_INV_1, _INV_2 = pow(0x21F0AAAD, -1, 1 << 32), pow(0x735A2D97, -1, 1 << 32)


def _unshift(x: int, s: int) -> int:
    """The inverse of ``x ^ (x >> s)`` on 32 bits."""
    y = x
    for _ in range(32 // s):
        y = x ^ (y >> s)
    return y


def inv_mix32(x: int) -> int:
    """The inverse of ``mix32`` (ints)."""
    x = _unshift(x, 15)
    x = (x * _INV_2) & M32
    x = _unshift(x, 15)
    x = (x * _INV_1) & M32
    return _unshift(x, 16)


@functools.lru_cache(maxsize=65536)
def _seed_key(seed: int) -> int:
    """mix32(seed), cached: a model's operand seeds are fixed, and mix32 in Python costs ~10 us a call on the host
    of every SR quantization."""
    return mix32(seed)


def stream_keys(stream: int) -> tuple[int, int]:
    """Two 32-bit keys of a 63-bit stream."""
    k1 = mix32((stream & M32) ^ mix32((stream >> 32) & M32))
    return k1, mix32(k1 ^ GOLDEN)


def sr_bits(shape: torch.Size | tuple[int, ...], seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Stochastic rounding's bits for a tensor of ``shape``: int32 in [0, 2**24), one per element, from
    the 63-bit stream ``seed``."""
    k1, k2 = stream_keys(seed)
    idx = torch.arange(int(torch.Size(shape).numel()), dtype=torch.int64, device=device).reshape(shape)
    h = mix32(mix32((idx & M32) ^ k1) ^ k2 ^ (idx >> 32))
    return (h >> (32 - SR_BITS)).to(torch.int32)
