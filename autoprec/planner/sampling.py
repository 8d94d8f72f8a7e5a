"""Which part of a GEMM calibration measures: about ``SAMPLED_ROWS`` evenly spaced output rows (tokens for
fprop and dgrad, output features for wgrad), at most as many evenly spaced columns, and of a batched
product (attention) at most ``MAX_BATCHES`` evenly spaced batch items. The operands' parts are quantized
with the whole operands' scales and SR bits (``dispatch.quantize(rows=..., batches=...)``), so every
measured output is exactly what the graph computes there."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SAMPLED_ROWS = 256
MAX_BATCHES = 8


def sampled_rows(m: int, batch: int = 1) -> slice | None:
    """Every k-th of the ``m`` rows of each of ``batch`` products, so that about ``SAMPLED_ROWS`` remain
    in all (at least one per product); None keeps all."""
    step = min(-(-m * batch // SAMPLED_ROWS), m)
    return None if step <= 1 else slice(0, m, step)


@dataclass(frozen=True)
class Sample:
    """The measured part of one GEMM ``a @ b``: batch items, rows of ``a``, columns of ``b`` (None: all)."""

    batches: slice | None = None
    rows: slice | None = None
    cols: slice | None = None

    @classmethod
    def of(cls, a_shape: torch.Size, b_shape: torch.Size) -> Sample:
        batches, batch = None, math.prod(a_shape[:-2])
        if len(a_shape) == 3 and batch > MAX_BATCHES:
            batches = slice(0, batch, -(-batch // MAX_BATCHES))
            batch = len(range(batch)[batches])
        return cls(batches, sampled_rows(a_shape[-2], batch), sampled_rows(b_shape[-1]))

    @property
    def whole(self) -> bool:
        return self.batches is None and self.rows is None and self.cols is None

    def part(self, which: int, ndim: int) -> dict:
        """``dispatch.quantize``'s arguments that quantize only the sampled part of operand ``which``
        (0: a's rows, 1: b's columns; the batch items of a 3D operand)."""
        return {"rows": (self.rows, self.cols)[which], "batches": self.batches if ndim == 3 else None}

    def pick(self, x: torch.Tensor | None, which: int) -> torch.Tensor | None:
        """The sampled part of ``a`` (``which`` 0), ``b`` or the bias (1), or the product (2)."""
        if x is None:
            return None
        if self.batches is not None and x.ndim == 3:
            x = x[self.batches]
        if which != 1 and self.rows is not None:
            x = x[..., self.rows, :]
        if which != 0 and self.cols is not None:
            x = x[..., self.cols]
        return x
