"""How the quantizers autotune their tiles on a GPU: a short benchmark per candidate tile, the winner kept on disk.

Each new (shape, stride, options) key benchmarks every candidate tile, during the first steps of a run. Triton's
default benchmark is 25 ms of warm-up and 100 ms of repetitions per tile, written for GEMMs; a quantization runs
in microseconds to a millisecond, so 5 and 20 ms still time hundreds of calls per tile at a fifth of the cost.
``cache_results`` keeps each key's winner in Triton's cache directory, so a later process at the same shapes (a
resumed or repeated run) does not benchmark them again. Every tile gives the same bytes: the choice changes speed
only.
"""
from __future__ import annotations

import inspect

import triton

from ..core.launch import interpreting

WARMUP_MS, REP_MS = 5, 20
_TAKES = inspect.signature(triton.autotune).parameters


def short_bench(fn, quantiles=None):
    """Triton's ``do_bench`` with ``WARMUP_MS`` of warm-up and ``REP_MS`` of repetitions."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, quantiles=quantiles)


def autotune(configs: list[triton.Config], interpreter: triton.Config, key: list[str], **kwargs):
    """``triton.autotune`` over ``configs`` (in the interpreter ``interpreter`` alone: its cost is per program,
    not bound by a GPU's registers), with ``short_bench`` and disk-cached results where this Triton takes them
    (3.2 on)."""
    extra = {name: value for name, value in (("do_bench", short_bench), ("cache_results", True)) if name in _TAKES}
    return triton.autotune(configs=[interpreter] if interpreting() else configs, key=key, **kwargs, **extra)


def fixed_tile(gpu: dict[str, int], interpreter: triton.Config) -> dict[str, int]:
    """A kernel's one tile where it is not autotuned (the amax passes): ``gpu`` on a GPU, in the interpreter
    ``interpreter``'s (fewer programs). A copy: callers may change it."""
    return dict(interpreter.kwargs if interpreting() else gpu)
