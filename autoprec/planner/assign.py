"""Assignment: a configuration for every GEMM of the model, from overrides, presets or the solver.

Precedence: a loaded plan file, then rl_trainer's matched sampler plan (fprop), then annotations and
glob overrides, then the recipe (a preset, or ``auto``: calibrated scores and the knapsack solver).
A GEMM whose shape cannot take the chosen block format runs in BF16, and the reason says so. The
assigner works on ``GemmSpec``s (plain data), so one model-level plan serves every graph.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace

from autoprec.formats import closest, get_format
from autoprec.roles import MatmulRole

from . import candidates as C
from .at_scale import AtScale, ReferenceShapes
from .calibration import Calibration, Stat
from .cost import get_hardware
from .gemm_spec import GemmKey, GemmSpec, key_seeds
from .options import GRAD_WEIGHTS, CompileOptions
from .overrides import GemmOwner, annotation_for, check_rules_match, parse_rules, rule_for
from .plan import Decision, Plan
from .solver import solve_mckp

SDPA_REASON = "fused scaled_dot_product_attention: left to its kernel, in the input dtype"
RL_ACTIVATIONS_REASON = ("RL phase: a product of two activations (attention's) runs BF16, since blocks along its "
                         "reduction would span tokens (p·v), and a row would then depend on other rows and on the KV "
                         "length while decoding")
NO_AMAX_REASON = "static activation scale: calibration never saw this GEMM's input"
NVIDIA_BF16_TAIL = 0.15  # nvfp4_nvidia keeps the last ~15% of blocks (and the head) in BF16
Choice = tuple[C.Candidate, str]


def damage(stat: Stat, role: MatmulRole, weights: tuple[float, float] = (GRAD_WEIGHTS["noise"],
                                                                         GRAD_WEIGHTS["bias"])) -> float:
    """One number per GEMM and configuration the budget adds up: the loss-aware relative error for
    fprop (plain relative error where no gradient was seen), weighted noise plus bias for backward
    (``weights``: the ``grad_weights`` option's (noise, bias))."""
    if role is MatmulRole.FPROP:
        return stat.loss if stat.loss is not None else stat.err
    noise, bias = weights
    return noise * stat.err + bias * abs(stat.bias)


def default_candidate(fmt: str, role: MatmulRole, has_weight: bool = False) -> C.Candidate:
    """The configuration a format named by an override, a plan match or a preset runs in: NVFP4 fprop
    round-to-nearest, its gradients stochastically rounded (and the RHT on wgrad); FP8-block with 128x128 tiles on
    a weight (DeepSeek-V3's and Transformer Engine's recipe)."""
    if fmt == "nvfp4":
        return {MatmulRole.FPROP: C.NVFP4, MatmulRole.DGRAD: C.NVFP4_SR, MatmulRole.WGRAD: C.NVFP4_SR_RHT}[role]
    if fmt == "fp8_block" and has_weight:
        return C.FP8_BLOCK_2D
    return C.Candidate(fmt)


def block_index(path: str) -> int | None:
    m = re.search(r"(?:^|\.)(\d+)(?:\.|$)", path)
    return int(m.group(1)) if m else None


class Assigner:
    """Chooses a Candidate for GEMMs of one model. ``module_names`` is the model's module tree (root-relative
    names in registration order): overrides and plan files are checked against it, and nvfp4_nvidia finds
    its blocks and head in it."""

    def __init__(self, opts: CompileOptions, calibration: Calibration | None, module_names: list[str]) -> None:
        self.opts, self.calibration = opts, calibration
        self.hw = get_hardware(opts.hardware)
        self.reference = ReferenceShapes(**opts.reference_shapes)
        self.at_scale = AtScale([], self.reference, self.hw)
        self.rules = parse_rules(opts.overrides)
        check_rules_match(self.rules, module_names)
        self.stages = [(p["from_step"], parse_rules(p["overrides"])) for p in opts.schedule]
        for _, rules in self.stages:
            check_rules_match(rules, module_names)
        self.plan_file = _by_key(opts.plan, "plan", module_names)
        self.match = _by_key(opts.match, "match", module_names)
        self.given_amax: dict[GemmKey, tuple] = {}  # static activation amaxes of the plan file's or match's decisions
        self.position = {name: i for i, name in enumerate(module_names)}
        blocks = [(block_index(n), i) for i, n in enumerate(module_names) if block_index(n) is not None]
        self.n_blocks = max(b for b, _ in blocks) + 1 if blocks else 0
        self.last_block_position = max((i for _, i in blocks), default=-1)

    def forced(self, g: GemmSpec) -> Choice | None:
        if g.sdpa:
            return None
        if self.plan_file is not None:
            d = self.plan_file.get(g.key)
            if d is None:
                raise ValueError(f"autoprec option plan: no decision for {g.key}; it was made for another model")
            _check_shape(d, g, "plan")
            self._take_amax(d, "plan")
            return _candidate_of(d), f"plan file: {d.reason}"
        if self.match is not None and g.role is MatmulRole.FPROP:
            d = self.match.get(g.key)
            if d is None:
                raise ValueError(f"autoprec option match: the sampler plan has no fprop for {g.module!r} (a GEMM the "
                                 f"sampler never ran: dropout or another attention path in training? RL trainers run "
                                 f"with dropout off)")
            _check_shape(d, g, "match")
            self._take_amax(d, "match")
            return _candidate_of(d), "matched to the rl_sampler plan"
        owner = GemmOwner(g.stack_ids, g.weight_id, g.frame_params)
        hit = annotation_for(owner, g.role) or rule_for(self.rules, g.module, g.role)
        return (default_candidate(hit[0], g.role, g.has_weight), hit[1]) if hit else None

    def _take_amax(self, d: Decision, option: str) -> None:
        """Keep a loaded decision's static activation amaxes; one that runs NVFP4 forward with dynamic scales
        cannot be reproduced under static ones (nor the other way round), which is an error, not a silent change."""
        if d.input_amax is not None:
            self.given_amax[d.key] = d.input_amax
        elif self.needs_amax(d.role, d.fmt):
            raise ValueError(f"autoprec option {option}: the plan runs {d.module!r} fprop in NVFP4 with dynamic "
                             f"activation scales (no input_amax), and these options use static ones (an RL phase, or "
                             f"activation_scale='static'): make that plan in an RL phase, or give both the same "
                             f"activation_scale")

    def needs_amax(self, role: MatmulRole, fmt: str) -> bool:
        """Whether a GEMM run as ``fmt`` in ``role`` takes static activation scales under these options."""
        return self.opts.static_activations and role is MatmulRole.FPROP and fmt == "nvfp4"

    def pending_amax(self, g: GemmSpec, choice: Choice) -> bool:
        """A choice that needs static activation amaxes nobody has measured yet (calibration will; a 3d x 3d
        experts product takes none, ``decision`` says so)."""
        return (self.needs_amax(g.role, choice[0].fmt) and g.layout != "3d3d" and g.key not in self.given_amax
                and not (self.calibration and g.key in self.calibration.amaxes))

    def scheduled(self, g: GemmSpec, stage: int) -> Choice | None:
        """The choice the schedule's stages 1..``stage`` impose on ``g`` (a later stage wins), or None."""
        hit = None
        for step, rules in self.stages[:stage]:
            rule = None if g.sdpa else rule_for(rules, g.module, g.role)
            if rule is not None:
                hit = default_candidate(rule[0], g.role, g.has_weight), f"schedule from step {step}: {rule[1]}"
        return hit

    def preset(self, g: GemmSpec) -> C.Candidate:
        """A uniform recipe's configuration: its format round-to-nearest in every role; FP8-block's weights in
        128x128 tiles (DeepSeek-V3's recipe)."""
        fp8_tiles = self.opts.recipe == "fp8_block" and g.has_weight
        return C.FP8_BLOCK_2D if fp8_tiles else C.Candidate(self.opts.recipe)

    def nvidia(self, g: GemmSpec) -> Choice:
        """NVIDIA's NVFP4 pretraining recipe: 16x16 weight scales, SR on gradients, RHT on wgrad,
        BF16 for the last ~15% of blocks and for the layers after the blocks (the head)."""
        idx = block_index(g.module)
        tail = math.ceil(NVIDIA_BF16_TAIL * self.n_blocks)
        if idx is not None and idx >= self.n_blocks - tail:
            return C.BF16, f"nvfp4_nvidia: block {idx} is in the last {tail} of {self.n_blocks}, BF16"
        if idx is None and self.n_blocks and self.position.get(g.module, -1) > self.last_block_position:
            return C.BF16, "nvfp4_nvidia: head after the blocks, BF16"
        tiles = g.has_weight and g.weight_shape is not None and len(g.weight_shape) == (3 if g.groups else 2)
        cand = {MatmulRole.FPROP: C.NVFP4_2D if tiles else C.NVFP4,
                MatmulRole.DGRAD: C.NVFP4_SR_2D if tiles else C.NVFP4_SR,
                MatmulRole.WGRAD: C.NVFP4_SR_RHT}[g.role]
        return cand, "nvfp4_nvidia recipe"

    def choose(self, specs: list[GemmSpec], only_forced: bool = False) -> dict[GemmKey, Choice]:
        """Forced choices first, then fused SDPA, then the preset or (``auto``) the solver; with
        ``only_forced`` the forced choices alone (what calibration already runs quantized)."""
        out: dict[GemmKey, Choice] = {}
        free = []
        for g in specs:
            forced = self.forced(g)
            if forced is not None:
                out[g.key] = forced
            elif only_forced:
                continue
            elif g.sdpa:
                out[g.key] = (C.BF16, SDPA_REASON)
            elif self.opts.rl and g.role is MatmulRole.FPROP and not g.has_weight:
                out[g.key] = (C.BF16, RL_ACTIVATIONS_REASON)
            elif self.opts.recipe == "nvfp4_nvidia":
                out[g.key] = self.nvidia(g)
            elif self.opts.recipe != "auto":
                out[g.key] = self.preset(g), f"recipe {self.opts.recipe}"
            else:
                free.append(g)
        out.update(self.solve(free))
        return out

    def unmeasured(self, g: GemmSpec) -> str | None:
        """Why ``g`` has nothing for the solver to weigh (it then runs in BF16), or None."""
        problems = [g.blocking[f] for f in self.hw.formats if f != "bf16"]
        if problems and all(problems):
            return " and ".join(problems)
        if self.calibration is None:
            return None
        if g.key in self.calibration.problems:
            return self.calibration.problems[g.key]
        if not self.calibration.stats.get(g.key):
            return "no calibration data (empty batches only, or first met after calibration)"
        return None

    def options(self, g: GemmSpec) -> list[tuple[C.Candidate, float, float]]:
        """(candidate, seconds, damage) the solver may pick for ``g``: eligible, measured, blockable."""
        stats = self.calibration.stats.get(g.key, {}) if self.calibration and not self.unmeasured(g) else {}
        opts = []
        for c in C.eligible(g.role, g.has_weight, self.hw.formats):
            if c in stats and not g.blocking.get(c.fmt):
                d = damage(stats[c], g.role, self.opts.damage_weights())
                if math.isfinite(d):
                    opts.append((c, self.seconds(g, c.fmt), d))
        return opts or [(C.BF16, self.seconds(g, "bf16"), 0.0)]

    def tokens(self, g: GemmSpec) -> tuple[float, ...] | None:
        """Each expert's mean token count in calibration (grouped GEMMs only)."""
        return self.calibration.tokens_per_group(g.key) if self.calibration and g.groups else None

    def set_specs(self, specs: list[GemmSpec]) -> None:
        """The model's GEMMs so far: the at-scale projection reads the traced widths and tokens off them."""
        self.at_scale = AtScale(specs, self.reference, self.hw)

    def seconds(self, g: GemmSpec, fmt: str) -> float:
        """The time the solver weighs: the roofline at the traced shapes, or (``cost="at_scale"``) the
        projection at the reference shapes."""
        if self.opts.cost == "at_scale":
            return self.at_scale.seconds(g, fmt)
        return g.seconds(fmt, self.hw, self.tokens(g))

    def solve(self, free: list[GemmSpec]) -> dict[GemmKey, Choice]:
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
            bf16 = sum(self.seconds(g, "bf16") for g in free)
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

    def decision(self, g: GemmSpec, choice: Choice, site: int) -> Decision:
        """The Decision for ``g`` under ``choice``, after the shape checks (block sizes, weight tiles)."""
        c, reason = choice
        problem = g.blocking.get(c.fmt)
        if problem:
            c, reason = C.BF16, f"{problem}: BF16 instead of {c.fmt}"
        if g.problem:
            c, reason = C.BF16, f"{g.problem}: BF16"
        fmt = get_format(c.fmt)
        tiles = g.tile_problem(fmt.tile) if c.tile2d else None
        if tiles:
            c, reason = replace(c, tile2d=False), f"{reason}; {tiles}: 1x{fmt.block_size} blocks instead"
        if g.scaled_addmm:
            c, reason = C.BF16, "addmm with alpha/beta scaling: not rewritten"
        amax = None
        if self.needs_amax(g.role, c.fmt) and g.layout == "3d3d":
            c, reason = C.BF16, f"{reason}; static activation scales: a 3d x 3d experts product takes none yet, BF16"
        elif self.needs_amax(g.role, c.fmt):
            measured = self.calibration.amaxes.get(g.key) if self.calibration else None
            amax = self.given_amax.get(g.key) or (tuple(measured) if measured else None)
            if amax is None:
                c, reason = C.BF16, f"{NO_AMAX_REASON}: BF16 instead of {c.label}"
            else:
                reason = f"{reason}; static activation amax {_amaxes(amax)}"
        stat = self.calibration.stats.get(g.key, {}).get(c) if self.calibration else None
        return Decision(
            site=site, module=g.module, role=g.role, index=g.key[2], shape=g.shape, batch=g.batch,
            fmt=c.fmt, rounding=c.rounding, rht=c.rht, tile2d=c.tile2d, reason=reason,
            seeds=key_seeds(self.opts.seed, g.key), rewritten=not (g.sdpa or g.scaled_addmm), flops=g.flops(),
            flops_expr=g.flops_expr, seconds=g.seconds(c.fmt, self.hw, self.tokens(g)),
            bf16_seconds=g.seconds("bf16", self.hw, self.tokens(g)), ref_seconds=self.at_scale.seconds(g, c.fmt),
            ref_bf16_seconds=self.at_scale.seconds(g, "bf16"),
            weight_elems=g.weight_elems(), weight_shape=g.weight_shape, err=stat.err if stat else None,
            bias=stat.bias if stat else None, loss=stat.loss if stat else None, groups=g.groups,
            group_tokens=self.tokens(g), group_err=stat.group_err if stat else None, input_amax=amax,
        )


def _amaxes(amax: tuple) -> str:
    return "/".join("-" if a is None else f"{a:.3g}" for a in amax)


def _check_shape(d: Decision, g: GemmSpec, option: str) -> None:
    """A saved decision must be for a weight of the same shape (plans of version 1 carry none)."""
    if d.weight_shape is not None and g.weight_shape is not None and tuple(d.weight_shape) != g.weight_shape:
        raise ValueError(f"autoprec option {option}: the decision for {d.module or '<root>'} {d.role} was made for "
                         f"a weight of shape {tuple(d.weight_shape)}, this model's is {g.weight_shape}: "
                         f"a plan of another model")


def _candidate_of(d: Decision) -> C.Candidate:
    return C.Candidate(d.fmt, d.rounding, d.rht, d.tile2d)


def _by_key(source, option: str, modules: list[str]) -> dict | None:
    """Decisions of a Plan (or plan file) by (module, role, index); modules not in the model are errors."""
    if source is None:
        return None
    plan = source if isinstance(source, Plan) else Plan.load(source)
    known = set(modules)
    for d in plan.decisions:
        if d.module not in known:
            raise ValueError(f"autoprec option {option}: module {d.module!r} is not in this model; "
                             f"closest: {closest(d.module, sorted(known) or ['<none>'])}")
    return {d.key: d for d in plan.decisions}
