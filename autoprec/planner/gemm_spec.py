"""A GEMM as the planner sees it: its key and what planning needs, without fx nodes.

A GEMM's key is (root-relative module path, role, ordinal among that module's GEMMs of the role), so every graph
of a model (graph-break frames, train / eval, prefill / decode, recompiles) names the same GEMM the same way.
``GemmSpec`` holds shapes, cost terms, blocking problems and provenance for annotations; the key also fixes the
GEMM's SR seeds (``key_seeds``). See docs/planner.md.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

from autoprec.kernels.core.random_bits import inv_mix32, mix32
from autoprec.roles import MatmulRole

from .cost import Hardware, gemm_seconds

GemmKey = tuple[str, str, int]  # (root-relative module path, role, ordinal)


def path_key(path: str, depth: int = 0) -> int:
    """The part of a GEMM's SR keys its module path gives: the XOR over the path's dotted parts, the first at
    ``depth``, of a hash of (part, its depth). Linear: ``path_key("blocks.3.attn.qkv")`` is
    ``path_key("blocks.3") ^ path_key("attn.qkv", 2)``, so a graph traced in a block (under regional
    compilation, or identical blocks after a graph break) carries the block's ``path_key`` in its step input
    and holds the same seeds in every block (``random_bits.offset_seed``)."""
    key = 0
    for i, part in enumerate(p for p in path.split(".") if p):
        key ^= mix32(zlib.crc32(f"{depth + i}|{part}".encode()))
    return key


def key_seeds(seed: int, key: GemmKey) -> tuple[int, int]:
    """Seeds of a GEMM's two operands: a function of the run's seed and the GEMM's key only, so every
    graph that runs the GEMM draws the same stream (the SR step is mixed in at run time). Each seed's key
    (mix32 of it) is ``path_key`` of the module path XOR a hash of (run seed, role, ordinal, operand)."""
    path = path_key(key[0])
    return tuple(inv_mix32(path ^ mix32(zlib.crc32(f"{seed}|{key[1]}|{key[2]}|{which}".encode())))
                 for which in (0, 1))


@dataclass
class GemmSpec:
    """One GEMM of the model as planning sees it (the shapes are those of the graph it was first met in)."""

    key: GemmKey
    role: MatmulRole
    stack_ids: tuple[str, ...]
    weight_id: int | None
    frame_params: frozenset[int]
    weight_shape: tuple[int, ...] | None
    has_weight: bool
    sdpa: bool
    problem: str | None
    scaled_addmm: bool
    shape: tuple[str, str, str]
    batch: str | None
    dims: tuple[int, int, int, int]
    flops_expr: str
    blocking: dict[str, str | None]
    groups: int | None = None  # grouped (experts) GEMMs: the number of experts
    layout: str | None = None  # grouped GEMMs: 2d3d, 2d2d or 3d3d

    @property
    def module(self) -> str:
        return self.key[0]

    def flops(self) -> float:
        b, m, n, k = self.dims
        return 2.0 * b * m * n * k

    def seconds(self, fmt: str, hw: Hardware, tokens: tuple[float, ...] | None = None) -> float:
        """Projected time in ``fmt``. A grouped GEMM is one GEMM per expert, each with its share of the
        tokens: ``tokens`` per expert (calibration's counts, scaled to this graph's total), else an even
        split; small experts are memory-bound, so a skewed routing gains less from low precision."""
        b, m, n, k = self.dims
        if self.layout not in ("2d3d", "2d2d"):
            return gemm_seconds(self.flops(), float(b * (m * k + k * n)), float(b * m * n), fmt, hw)
        total = m if self.layout == "2d3d" else k
        counts = tokens if tokens and sum(tokens) > 0 else (1.0,) * self.groups
        share = [total * c / sum(counts) for c in counts]
        if self.layout == "2d3d":  # (t, K) x (K, N) per expert
            return sum(gemm_seconds(2.0 * t * n * k, t * k + k * n, t * n, fmt, hw) for t in share)
        return sum(gemm_seconds(2.0 * m * n * t, m * t + t * n, m * n, fmt, hw) for t in share)  # wgrad

    def weight_elems(self) -> int:
        if not self.has_weight or self.role is not MatmulRole.FPROP:
            return 0
        _, _, n, k = self.dims
        return n * k * (self.groups or 1)

    def tile_problem(self, tile: int = 16) -> str | None:
        """Why this GEMM's weight cannot take square tiles of side ``tile`` (NVFP4's 16, FP8-block's 128; None when
        it can); an experts weight (E, K, N) takes them per expert."""
        tiles = f"{tile}x{tile} tiles"
        per_expert = self.groups is not None and self.weight_shape is not None and len(self.weight_shape) == 3
        if not self.has_weight or self.weight_shape is None or (len(self.weight_shape) != 2 and not per_expert):
            return f"{tiles} need a 2D weight, this one is {self.weight_shape}"
        if any(s % tile for s in self.weight_shape[-2:]):
            return f"{tiles} need both weight dims to be multiples of {tile}, weight {self.weight_shape}"
        return None


