"""Weights prepared once per weight version for inference graphs (a sampler's decode steps).

A decode step multiplies a few rows by every weight, so quantizing (or casting) each weight at every call costs more
than the product. Each planned weight operand of an inference graph keeps its prepared form (the quantized operand,
or on the CPU path the decoded fp32 values its reference product multiplies) under a key naming the model and GEMM,
with what identifies the weight's contents: its data pointer, shape and strides, and its version counter, which
every in-place write through autograd's view of the tensor bumps (an optimizer step, ``load_state_dict``, ``copy_``,
FSDP2's all-gather into the unsharded parameter); an assignment to ``.data`` moves the data pointer. The entry holds
a reference to the weight it was made from, so that memory cannot be reused by another tensor while the entry is
alive. A write the version counter cannot see (through ``param.data``, a tensor with a counter of its own) needs
``autoprec.refresh_weights()``; docs/rl.md says when.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

_GENERATION = [0]


@dataclass
class _Entry:
    source: torch.Tensor
    identity: tuple
    prepared: object


_CACHE: dict[str, _Entry] = {}


def _identity(w: torch.Tensor) -> tuple:
    return (w.data_ptr(), w.device, w.dtype, tuple(w.shape), w.stride(), w._version, _GENERATION[0])


def prepared(key: str, w: torch.Tensor, make: Callable[[], object]) -> object:
    """The prepared form of weight ``w`` at GEMM ``key``: the cached one while ``w``'s contents are unchanged, else
    ``make()`` (kept for the next call)."""
    entry = _CACHE.get(key)
    identity = _identity(w)
    if entry is not None and entry.identity == identity:
        return entry.prepared
    value = make()
    _CACHE[key] = _Entry(w, identity, value)
    return value


def refresh() -> None:
    """Forget every prepared weight: the next call of each planned GEMM prepares its weight again."""
    _GENERATION[0] += 1
    _CACHE.clear()


def cached_count() -> int:
    """How many weights are held prepared."""
    return len(_CACHE)
