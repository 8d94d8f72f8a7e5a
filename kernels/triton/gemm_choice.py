"""Which product multiplies sm_90's decoded operands: cuBLAS's bf16 GEMM writing an fp32 product that a Triton pass
scales and rounds, or Triton's bf16 GEMM with that epilogue in its registers. Neither wins everywhere on paper
(cuBLAS's kernels are tuned per GPU and shape, Triton's saves the fp32 product's round trip, 8 bytes per output
element), so each new key (the GEMM's dims, each rounded up to a power of two, the operands' kinds, bias and
output dtype) times both on the GPU once, with the quantizers' short benchmark (``autotune.short_bench``), and keeps
the faster: in memory, and on disk in Triton's cache directory (``TRITON_CACHE_DIR``), so a resumed or repeated run
on the same GPU, torch and Triton takes the same product at the same shapes, and gets the same bits.

The two equal the reference up to fp32 accumulation order, not each other bit for bit: ``AUTOPREC_DECODED_GEMM``
(``cublas`` or ``triton``; ``auto``, the default, measures) pins one, for runs that must agree across machines.
Off a GPU, in the interpreter or while a CUDA graph is being captured (where a benchmark cannot run), an unmeasured
key takes cuBLAS's product and is not remembered."""
from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch

from ..core.launch import interpreting
from .autotune import short_bench

ENV = "AUTOPREC_DECODED_GEMM"
PRODUCTS = ("cublas", "triton")  # the first is taken where nothing is measured
_CHOSEN: dict[tuple, str] = {}
_FILE = "decoded_gemm.json"  # a choice's record in its Triton cache entry


def pinned() -> str | None:
    """The product ``AUTOPREC_DECODED_GEMM`` pins (None for ``auto`` or unset)."""
    value = os.environ.get(ENV)
    if value is None:  # read on every decoded GEMM: the common case first
        return None
    value = value.lower()
    if value not in ("auto",) + PRODUCTS:
        raise ValueError(f"{ENV}={value!r} is not valid; use one of auto, {', '.join(PRODUCTS)}")
    return None if value == "auto" else value


def size_bucket(n: int) -> int:
    """``n`` rounded up to a power of two: a GEMM's dims as its key holds them. The tokens vary from batch to batch
    and are M in fprop and dgrad but K in wgrad, so every dim is rounded: one timing serves a range of shapes."""
    return 1 << max(n - 1, 0).bit_length()


def choose(key: tuple, candidates: dict[str, Callable[[], object]], device: torch.device) -> str:
    """The name of the faster of ``candidates`` (callables running each product, keyed by ``PRODUCTS``' names) for
    ``key``: pinned by the environment, else remembered, else read from disk, else timed now on ``device``."""
    name = pinned()
    if name is not None:
        return name
    key = (device.type, device.index) + key
    if key in _CHOSEN:
        return _CHOSEN[key]
    if not measurable(device):
        return PRODUCTS[0]
    cache = _disk_cache(key)
    name = _read(cache)
    if name is None:
        timings = {name: short_bench(fn) for name, fn in candidates.items()}
        name = min(timings, key=timings.get)
        record = {"key": repr(key[2:]), "ms": timings, "chosen": name}
        cache.put(json.dumps(record), _FILE, binary=False)
    _CHOSEN[key] = name
    return name


def measurable(device: torch.device) -> bool:
    """Whether products can be timed on ``device`` now: a GPU outside the interpreter, no CUDA graph capturing."""
    return device.type == "cuda" and not interpreting() and not torch.cuda.is_current_stream_capturing()


def chosen() -> dict[tuple, str]:
    """A copy of the choices made in this process, by key (device type and index, then the caller's key)."""
    return dict(_CHOSEN)


def _disk_cache(key: tuple):
    """The Triton cache entry holding ``key``'s choice: it changes with the GPU model, torch (cuBLAS), Triton and the
    products' code."""
    from triton.runtime.cache import get_cache_manager, triton_key

    gpu = torch.cuda.get_device_name(key[1]) if key[0] == "cuda" else key[0]
    parts = (triton_key(), torch.__version__, str(torch.version.cuda), gpu, _products_source(), repr(key[2:]))
    return get_cache_manager(hashlib.sha256("-".join(parts).encode()).hexdigest())


@functools.cache
def _products_source() -> str:
    """A hash of the modules holding the two products' kernels and launches (read as files: they import this
    module)."""
    here = Path(__file__).parent
    return hashlib.sha256(b"".join((here / name).read_bytes() for name in ("scaled_mm_decoded.py", "scaled_mm.py"))
                          ).hexdigest()


def _read(cache) -> str | None:
    """The product recorded in ``cache`` (None where none is)."""
    path = cache.get_file(_FILE)
    if path is None:
        return None
    with open(path) as f:
        name = json.load(f)["chosen"]
    return name if name in PRODUCTS else None
