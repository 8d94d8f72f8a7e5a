"""Analysis pass: the GEMMs of one graph as plain data keyed for the model-level plan.

A GEMM's key is (root-relative module path, role, ordinal among that module's GEMMs of the role), so
every graph of a model (graph-break frames, train / eval, prefill / decode, recompiles) names the same
GEMM the same way. ``GemmSpec`` holds what planning needs (shapes, cost terms, blocking problems,
provenance for annotations) without fx nodes; ``GraphGemm`` ties a spec to its node in one graph.
"""
from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

import sympy
from torch.fx.experimental.symbolic_shapes import statically_known_true

from autoprec.cost import Hardware, gemm_seconds
from autoprec.formats import FORMATS, get_format
from autoprec.kernels.core.random_bits import inv_mix32, mix32
from autoprec.passes.classify_roles import RoleInfo
from autoprec.passes.group_sites import Site
from autoprec.roles import MatmulRole

GemmKey = tuple[str, str, int]  # (root-relative module path, role, ordinal)


def _hint(v) -> int:
    """A size at the traced sizes; a data-dependent one (``nonzero``'s count, captured with dynamo's
    ``capture_dynamic_output_shape_ops``) has no value there and is costed as inductor sizes it
    (``unbacked_symint_fallback``): K and N decide a GEMM's blocks, not M."""
    if isinstance(v, int):
        return v
    if v.node.hint is not None:
        return int(v.node.hint)
    from torch._inductor.config import unbacked_symint_fallback

    env = v.node.shape_env
    if hasattr(env, "optimization_hint"):  # torch 2.13; its size_hint is deprecated there
        return int(env.optimization_hint(v.node.expr, fallback=unbacked_symint_fallback))
    hint = env.size_hint(v.node.expr, allow_none=True)
    return unbacked_symint_fallback if hint is None else int(hint)


def _expr(v) -> sympy.Expr:
    return sympy.Integer(v) if isinstance(v, int) else v.node.expr


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

    def tile_problem(self) -> str | None:
        """Why this GEMM's weight cannot take 16x16 NVFP4 tiles (None when it can); an experts weight
        (E, K, N) takes them per expert."""
        per_expert = self.groups is not None and self.weight_shape is not None and len(self.weight_shape) == 3
        if not self.has_weight or self.weight_shape is None or (len(self.weight_shape) != 2 and not per_expert):
            return f"16x16 tiles need a 2D weight, this one is {self.weight_shape}"
        if any(s % 16 for s in self.weight_shape[-2:]):
            return f"16x16 tiles need both weight dims to be multiples of 16, weight {self.weight_shape}"
        return None


@dataclass
class GraphGemm:
    """A GEMM node of one graph with its spec."""

    spec: GemmSpec
    info: RoleInfo
    pair: int  # graph-local id of its site: ties backward GEMMs to their fprop during calibration


def blocking_problem(k, fmt_name: str) -> str | None:
    """Why a GEMM with reduction size ``k`` cannot take blocks of the block format ``fmt_name``."""
    fmt = get_format(fmt_name)
    if isinstance(k, int):
        return f"K={k} is not a multiple of the {fmt.name} block {fmt.block_size}" if k % fmt.block_size else None
    if not statically_known_true(k % fmt.block_size == 0):
        return f"K={k} is dynamic and not provably a multiple of the {fmt.name} block {fmt.block_size}"
    return None


def graph_gemms(sites: list[Site], path_of: Callable[[Site], str], weight_ids: dict) -> list[GraphGemm]:
    """Every GEMM of the sites, keyed by root-relative module path (``path_of(site)``), role and ordinal.
    ``weight_ids`` maps parameter placeholders to the real parameters' ids."""
    out = []
    ordinals: dict[tuple[str, str], int] = {}
    frame = frozenset(weight_ids.values())
    for site in sites:
        path = path_of(site)
        for info in site.gemms:
            role = str(info.role)
            ordinal = ordinals.get((path, role), 0)
            ordinals[(path, role)] = ordinal + 1
            mm = info.mm
            batch = sympy.Integer(1) if mm.batch is None else _expr(mm.batch)
            w = site.weight
            spec = GemmSpec(
                key=(path, role, ordinal), role=info.role, stack_ids=site.stack_ids,
                weight_id=weight_ids.get(w), frame_params=frame,
                weight_shape=None if w is None else tuple(_hint(v) for v in w.meta["val"].shape),
                has_weight=info.weight_operand is not None, sdpa=site.sdpa, problem=site.problem,
                scaled_addmm=mm.node.target.__name__.startswith("addmm") and mm.bias is None,
                shape=(str(mm.m), str(mm.n), str(mm.k)), batch=None if mm.batch is None else str(mm.batch),
                dims=(1 if mm.batch is None else _hint(mm.batch), _hint(mm.m), _hint(mm.n), _hint(mm.k)),
                flops_expr=str(sympy.expand(2 * batch * _expr(mm.m) * _expr(mm.n) * _expr(mm.k))),
                blocking={f: None if mm.layout == "2d2d" else blocking_problem(mm.k, f)
                          for f, fmt in FORMATS.items() if fmt.quantized},
                groups=mm.groups, layout=mm.layout,
            )
            out.append(GraphGemm(spec, info, site.index))
    return out
