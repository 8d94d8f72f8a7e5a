"""Assignment pass: a configuration for every GEMM, from overrides, presets or the solver.

Precedence: a loaded plan file, then rl_trainer's matched sampler plan (fprop), then annotations and
glob overrides, then the recipe (a preset, or ``auto``: calibrated scores and the knapsack solver).
A GEMM whose shape cannot take the chosen block format runs in BF16, and the reason says so.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import sympy
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from autoprec.cost import Hardware, gemm_seconds, get_hardware
from autoprec.formats import closest, get_format
from autoprec.options import CompileOptions
from autoprec.overrides import GemmOwner, annotation_for, check_rules_match, parse_rules, rule_for
from autoprec.passes import candidates as C
from autoprec.passes.calibrate import Calibration, GemmKey, Stat
from autoprec.passes.classify_roles import RoleInfo
from autoprec.passes.group_sites import Site
from autoprec.plan import Decision, Plan
from autoprec.roles import MatmulRole
from autoprec.solver import solve_mckp

SDPA_REASON = "fused scaled_dot_product_attention: left to its kernel, in the input dtype"
GRAD_NOISE_WEIGHT = 0.25  # backward noise averages out over tokens and steps; bias does not
NVIDIA_BF16_TAIL = 0.15  # nvfp4_nvidia keeps the last ~15% of blocks (and the head) in BF16


def _hint(v) -> int:
    return v if isinstance(v, int) else int(v.node.hint)


def _expr(v) -> sympy.Expr:
    return sympy.Integer(v) if isinstance(v, int) else v.node.expr


@dataclass
class Gemm:
    """One GEMM with what assignment needs: its key, cost terms and provenance."""

    site: Site
    info: RoleInfo
    key: GemmKey
    seeds: tuple[int, int]
    name_index: int = 0  # ordinal among the GEMMs of the same module and role (a plan's key)

    @property
    def role(self) -> MatmulRole:
        return self.info.role

    @property
    def has_weight(self) -> bool:
        return self.info.weight_operand is not None

    def dims(self) -> tuple[int, int, int, int]:
        mm = self.info.mm
        return (1 if mm.batch is None else _hint(mm.batch)), _hint(mm.m), _hint(mm.n), _hint(mm.k)

    def flops(self) -> float:
        b, m, n, k = self.dims()
        return 2.0 * b * m * n * k

    def flops_expr(self) -> str:
        """FLOPs as an expression in the graph's symbolic sizes (a number for static shapes)."""
        mm = self.info.mm
        batch = sympy.Integer(1) if mm.batch is None else _expr(mm.batch)
        return str(sympy.expand(2 * batch * _expr(mm.m) * _expr(mm.n) * _expr(mm.k)))

    def operand_elems(self) -> float:
        b, m, n, k = self.dims()
        return float(b * (m * k + k * n))

    def out_elems(self) -> float:
        b, m, n, _ = self.dims()
        return float(b * m * n)

    def weight_shape(self) -> tuple[int, ...] | None:
        """Shape of the layer's weight parameter (None for activation x activation products)."""
        w = self.site.weight
        return None if w is None else tuple(_hint(v) for v in w.meta["val"].shape)

    def weight_elems(self) -> int:
        if not self.has_weight or self.role is not MatmulRole.FPROP:
            return 0
        _, _, n, k = self.dims()
        return n * k

    def seconds(self, fmt: str, hw: Hardware) -> float:
        return gemm_seconds(self.flops(), self.operand_elems(), self.out_elems(), fmt, hw)


def gemms_of(sites: list[Site], seed: int) -> list[Gemm]:
    """Every GEMM of the sites, keyed by (site, role, ordinal in site) and numbered per module."""
    out = []
    per_module: dict[tuple[str, str], int] = {}
    for site in sites:
        seen: dict[str, int] = {}
        for info in site.gemms:
            role = str(info.role)
            ordinal = seen.get(role, 0)
            seen[role] = ordinal + 1
            name_index = per_module.get((site.module_path, role), 0)
            per_module[(site.module_path, role)] = name_index + 1
            s = seed + 2 * len(out)
            out.append(Gemm(site, info, (site.index, role, ordinal), (s, s + 1), name_index))
    return out


def damage(stat: Stat, role: MatmulRole) -> float:
    """One number per GEMM and configuration the budget adds up: the loss-aware relative error for
    fprop (plain relative error where no gradient was seen), discounted noise plus bias for backward."""
    if role is MatmulRole.FPROP:
        return stat.loss if stat.loss is not None else stat.err
    return GRAD_NOISE_WEIGHT * stat.err + abs(stat.bias)


def default_candidate(fmt: str, role: MatmulRole) -> C.Candidate:
    """The phase policy's configuration for a format named by an override or a plan match."""
    if fmt == "nvfp4":
        return {MatmulRole.FPROP: C.NVFP4, MatmulRole.DGRAD: C.NVFP4_SR, MatmulRole.WGRAD: C.NVFP4_SR_RHT}[role]
    return C.Candidate(fmt)


def _block_index(path: str) -> int | None:
    m = re.search(r"(?:^|\.)(\d+)(?:\.|$)", path)
    return int(m.group(1)) if m else None


def nvidia_candidate(g: Gemm, n_blocks: int, last_block_site: int) -> tuple[C.Candidate, str]:
    """NVIDIA's NVFP4 pretraining recipe: 16x16 weight scales, SR on gradients, RHT on wgrad,
    BF16 for the last ~15% of blocks and for the layers after the blocks (the head)."""
    idx = _block_index(g.site.module_path)
    tail = math.ceil(NVIDIA_BF16_TAIL * n_blocks)
    if idx is not None and idx >= n_blocks - tail:
        return C.BF16, f"nvfp4_nvidia: block {idx} is in the last {tail} of {n_blocks}, BF16"
    if idx is None and n_blocks and g.site.index > last_block_site:
        return C.BF16, "nvfp4_nvidia: head after the blocks, BF16"
    tiles = g.has_weight and g.info.mm.b.meta["val"].ndim == 2
    cand = {MatmulRole.FPROP: C.NVFP4_2D if tiles else C.NVFP4,
            MatmulRole.DGRAD: C.NVFP4_SR_2D if tiles else C.NVFP4_SR,
            MatmulRole.WGRAD: C.NVFP4_SR_RHT}[g.role]
    return cand, "nvfp4_nvidia recipe"


def blocking_problem(g: Gemm, fmt_name: str) -> str | None:
    """Why this GEMM cannot take ``fmt_name`` blocks (None when it can)."""
    fmt = get_format(fmt_name)
    if not fmt.quantized:
        return None
    k = g.info.mm.k
    if isinstance(k, int):
        return f"K={k} is not a multiple of the {fmt.name} block {fmt.block_size}" if k % fmt.block_size else None
    if not statically_known_true(k % fmt.block_size == 0):
        return f"K={k} is dynamic and not provably a multiple of the {fmt.name} block {fmt.block_size}"
    return None


def tile_problem(g: Gemm) -> str | None:
    """Why ``g``'s weight cannot take 16x16 NVFP4 tiles (None when it can)."""
    shape = g.weight_shape()
    if shape is None or len(shape) != 2:
        return f"16x16 tiles need a 2D weight, this one is {shape}"
    if any(s % 16 for s in shape):
        return f"16x16 tiles need both weight dims to be multiples of 16, weight {shape}"
    return None


class Assigner:
    """Chooses a Candidate for every GEMM of one graph."""

    def __init__(self, sites: list[Site], opts: CompileOptions, calibration: Calibration | None,
                 weight_ids: dict[fx.Node, int] | None = None) -> None:
        self.opts, self.calibration = opts, calibration
        self.weight_ids = weight_ids or {}
        self.frame_params = frozenset(self.weight_ids.values())
        self.hw = get_hardware(opts.hardware)
        self.gemms = gemms_of(sites, opts.seed)
        self.rules = parse_rules(opts.overrides)
        modules = [g.site.module_path for g in self.gemms]
        check_rules_match(self.rules, modules)
        self.plan_file = _by_key(opts.plan, "plan", modules)
        self.match = _by_key(opts.match, "match", modules)
        blocks = [(_block_index(g.site.module_path), g.site.index) for g in self.gemms]
        idxs = [b for b, _ in blocks if b is not None]
        self.n_blocks = max(idxs) + 1 if idxs else 0
        self.last_block_site = max((s for b, s in blocks if b is not None), default=-1)

    def forced(self, g: Gemm) -> tuple[C.Candidate, str] | None:
        name_key = (g.site.module_path, str(g.role), g.name_index)
        if self.plan_file is not None:
            d = self.plan_file.get(name_key)
            if d is None:
                raise ValueError(f"autoprec option plan: no decision for {name_key}; it was made for another model")
            _check_shape(d, g, "plan")
            return _candidate_of(d), f"plan file: {d.reason}"
        if self.match is not None and g.role is MatmulRole.FPROP:
            d = self.match.get(name_key)
            if d is None:
                raise ValueError(f"autoprec option match: the sampler plan has no fprop for {g.site.module_path!r}")
            _check_shape(d, g, "match")
            return _candidate_of(d), "matched to the rl_sampler plan"
        owner = GemmOwner(g.site.stack_ids, self.weight_ids.get(g.site.weight), self.frame_params)
        hit = annotation_for(owner, g.role) or rule_for(self.rules, g.site.module_path, g.role)
        return (default_candidate(hit[0], g.role), hit[1]) if hit else None

    def preset(self, g: Gemm) -> tuple[C.Candidate, str]:
        if self.opts.recipe == "nvfp4_nvidia":
            return nvidia_candidate(g, self.n_blocks, self.last_block_site)
        return C.Candidate(self.opts.recipe), f"recipe {self.opts.recipe}"

    def assign(self) -> dict[GemmKey, tuple[C.Candidate, str]]:
        """Forced choices first, then fused SDPA, then the preset or (``auto``) the solver."""
        out = self.forced_only()
        free = []
        for g in self.gemms:
            if g.key in out:
                continue
            if g.site.sdpa:
                out[g.key] = (C.BF16, SDPA_REASON)
            elif self.opts.recipe != "auto":
                out[g.key] = self.preset(g)
            else:
                free.append(g)
        out.update(self.solve(free))
        return out

    def unmeasured(self, g: Gemm) -> str | None:
        """Why ``g`` has nothing for the solver to weigh (it then runs in BF16), or None."""
        problems = [blocking_problem(g, f) for f in ("nvfp4", "mxfp8")]
        if all(problems):
            return " and ".join(problems)
        if self.calibration is None:
            return None
        if g.key in self.calibration.problems:
            return self.calibration.problems[g.key]
        if not self.calibration.stats.get(g.key):
            return "calibration saw no values (empty batches only)"
        return None

    def options(self, g: Gemm) -> list[tuple[C.Candidate, float, float]]:
        """(candidate, seconds, damage) the solver may pick for ``g``: eligible, measured, blockable."""
        stats = self.calibration.stats.get(g.key, {}) if self.calibration and not self.unmeasured(g) else {}
        opts = []
        for c in C.eligible(g.role, g.has_weight):
            if c in stats and not blocking_problem(g, c.fmt):
                d = damage(stats[c], g.role)
                if math.isfinite(d):
                    opts.append((c, g.seconds(c.fmt, self.hw), d))
        return opts or [(C.BF16, g.seconds("bf16", self.hw), 0.0)]

    def solve(self, free: list[Gemm]) -> dict[GemmKey, tuple[C.Candidate, str]]:
        """The knapsack over ``free``; GEMMs with nothing measured take part as BF16-only items."""
        if not free:
            return {}
        options = [self.options(g) for g in free]
        if self.opts.target_speedup is None:
            limit = self.opts.budget * len(free)
            picks = solve_mckp([[(t, d) for _, t, d in o] for o in options], limit)
            if picks is None:
                raise ValueError(f"autoprec option budget={self.opts.budget} is below even all-BF16 damage")
            goal = f"fastest within budget {self.opts.budget:.1e}/GEMM"
        else:
            bf16 = sum(g.seconds("bf16", self.hw) for g in free)
            limit = bf16 / self.opts.target_speedup
            picks = solve_mckp([[(d, t) for _, t, d in o] for o in options], limit)
            if picks is None:
                best = bf16 / sum(min(t for _, t, _ in o) for o in options)
                raise ValueError(f"autoprec option target_speedup={self.opts.target_speedup} is out of reach; "
                                 f"at most {best:.2f}x here")
            goal = f"least damage at {self.opts.target_speedup:.2f}x"
        out = {}
        for g, o, j in zip(free, options, picks):
            c, _, d = o[j]
            why = self.unmeasured(g)
            if why:
                out[g.key] = (C.BF16, f"auto: {why}: BF16")
                continue
            others = ", ".join(f"{x.label} {dx:.1e}" for x, _, dx in o if x != c)
            out[g.key] = (c, f"auto ({goal}): damage {d:.1e}" + (f"; others {others}" if others else ""))
        return out

    def forced_only(self) -> dict[GemmKey, tuple[C.Candidate, str]]:
        """The choices fixed before any measurement (plan file, matched sampler plan, overrides)."""
        out = {}
        for g in self.gemms:
            choice = None if g.site.sdpa else self.forced(g)
            if choice is not None:
                out[g.key] = choice
        return out

    def decisions(self, only_forced: bool = False) -> dict[fx.Node, Decision]:
        """Decisions for every GEMM, or with ``only_forced`` for the forced ones alone."""
        chosen = self.forced_only() if only_forced else self.assign()
        out = {}
        for g in self.gemms:
            if g.key not in chosen:
                continue
            c, reason = chosen[g.key]
            problem = blocking_problem(g, c.fmt)
            if problem:
                c, reason = C.BF16, f"{problem}: BF16 instead of {c.fmt}"
            if g.site.problem:
                c, reason = C.BF16, f"{g.site.problem}: BF16"
            tiles = tile_problem(g) if c.tile2d else None
            if tiles:
                c, reason = replace(c, tile2d=False), f"{reason}; {tiles}: 1x16 blocks instead"
            scaled_addmm = g.info.mm.node.target.__name__.startswith("addmm") and g.info.mm.bias is None
            if scaled_addmm:
                c, reason = C.BF16, "addmm with alpha/beta scaling: not rewritten"
            stat = (self.calibration.stats.get(g.key, {}).get(c) if self.calibration else None)
            mm = g.info.mm
            out[mm.node] = Decision(
                site=g.site.index, module=g.site.module_path, role=g.role, index=g.name_index,
                shape=(str(mm.m), str(mm.n), str(mm.k)), batch=None if mm.batch is None else str(mm.batch),
                fmt=c.fmt, rounding=c.rounding, rht=c.rht, tile2d=c.tile2d, reason=reason, seeds=g.seeds,
                rewritten=not (g.site.sdpa or scaled_addmm), flops=g.flops(), flops_expr=g.flops_expr(),
                seconds=g.seconds(c.fmt, self.hw), bf16_seconds=g.seconds("bf16", self.hw),
                weight_elems=g.weight_elems(), weight_shape=g.weight_shape(), err=stat.err if stat else None, bias=stat.bias if stat else None,
                loss=stat.loss if stat else None,
            )
        return out


def _check_shape(d: Decision, g: Gemm, option: str) -> None:
    """A saved decision must be for a weight of the same shape (plans of version 1 carry none)."""
    here = g.weight_shape()
    if d.weight_shape is not None and here is not None and tuple(d.weight_shape) != here:
        raise ValueError(f"autoprec option {option}: the decision for {d.module or '<root>'} {d.role} was made for "
                         f"a weight of shape {tuple(d.weight_shape)}, this model's is {here}: a plan of another model")


def _candidate_of(d: Decision) -> C.Candidate:
    return C.Candidate(d.fmt, d.rounding, d.rht, d.tile2d)


def _by_key(source, option: str, modules: list[str]) -> dict | None:
    """Decisions of a Plan (or plan file) by (module, role, index); unknown modules are errors."""
    if source is None:
        return None
    plan = source if isinstance(source, Plan) else Plan.load(source)
    known = set(modules)
    for d in plan.decisions:
        if d.module not in known:
            raise ValueError(f"autoprec option {option}: module {d.module!r} is not in this model; "
                             f"closest: {closest(d.module, sorted(known) or ['<none>'])}")
    return {d.key: d for d in plan.decisions}


def assign(sites: list[Site], opts: CompileOptions, calibration: Calibration | None,
           weight_ids: dict[fx.Node, int] | None = None) -> dict[fx.Node, Decision]:
    """The assignment pass: a Decision for every GEMM node of the graph. ``weight_ids`` maps parameter
    placeholders to the ids of the real parameters (for annotations)."""
    return Assigner(sites, opts, calibration, weight_ids).decisions()


def assign_forced(sites: list[Site], opts: CompileOptions,
                  weight_ids: dict[fx.Node, int] | None = None) -> dict[fx.Node, Decision]:
    """Decisions known before calibration (overrides, plan file, matched sampler forward)."""
    return Assigner(sites, opts, None, weight_ids).decisions(only_forced=True)
