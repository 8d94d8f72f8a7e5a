"""A byte-level text corpus every machine has: the Python standard library's sources.

Files are read in sorted path order, so the data (and its train / validation split) is the same on
every machine with the same Python version.
"""
from __future__ import annotations

import sysconfig
from pathlib import Path

import torch


def stdlib_bytes(limit: int = 4_000_000) -> torch.Tensor:
    """Up to ``limit`` bytes of the stdlib's ``*.py`` files, concatenated in sorted order (uint8)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= limit:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)[:limit]), dtype=torch.uint8)


class Batches:
    """Random (input, target) windows of ``ctx`` bytes from a split, reproducible from ``seed``."""

    def __init__(self, data: torch.Tensor, ctx: int, batch: int, seed: int) -> None:
        self.data, self.ctx, self.batch = data.long(), ctx, batch
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(self.data) - self.ctx - 1, (self.batch,), generator=self.gen)
        rows = torch.stack([self.data[s : s + self.ctx + 1] for s in starts.tolist()])
        return rows[:, :-1], rows[:, 1:]


def split(data: torch.Tensor, val_fraction: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    cut = int(len(data) * (1 - val_fraction))
    return data[:cut], data[cut:]
