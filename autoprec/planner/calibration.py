"""Calibration's measurements and their store: for every GEMM the calibrating interpreter
(``passes/calibrate.py``) hands over, and every candidate configuration, the error the rewrite would make.

Per GEMM and candidate, on the part of the output ``sampling.Sample`` picks (only the operands' parts
it reads are quantized, with the whole operands' scales and SR bits, so each measured output is exactly
what the graph computes): relative error ``|Ŷ-Y|²/|Y|²`` (noise), relative bias
``mean((Ŷ-Y)·sign(Y)) / mean|Y|`` (signed error against the signal), and for fprop GEMMs the loss-aware
score ``Σ(∂L/∂Y)²(Ŷ-Y)² / Σ(∂L/∂Y)²Y²``, with ∂L/∂Y taken from the gradient operand of the same site's
backward GEMMs when they run. Ŷ comes from the same quantize calls the rewritten graph makes, so what is
measured is what will run. The exact product and the sums are computed in fp32 (float64 where the
product's range demands it, and for grouped GEMMs) on values divided by the exact product's max, so the
scores do not depend on the data's scale.
A GEMM whose operands hold NaN/Inf is not measured: its ``problems`` entry says so, and the plan runs
it in BF16.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from autoprec.kernels.dispatch import dense as dispatch
from autoprec.kernels.dispatch import scaled_mm
from autoprec.kernels.dispatch.grouped import group_bounds
from autoprec.kernels.dispatch.grouped_mm import grouped_mm
from autoprec.kernels.reference.hadamard import rht_signs
from autoprec.roles import MatmulRole

from .candidates import Candidate, grouped_config, measured, operand_spec
from .errors import (
    blockable,
    blocked_copy,
    dot,
    exact_product,
    group_errors,
    non_finite,
    normalized_error,
    ratio,
    scale_of,
)
from .gemm_spec import GemmKey
from .sampling import Sample, sampled_rows


@dataclass
class Stat:
    """Scores of one configuration of one GEMM, averaged over the ``count`` times it was measured
    (several calibration steps, several graphs running the GEMM, several ranks)."""

    err: float
    bias: float
    loss: float | None = None
    count: int = 1
    loss_count: int = 0
    group_err: tuple[float, ...] | None = None  # grouped GEMMs: the relative error of each expert's group

    def merge(self, other: "Stat") -> None:
        n = self.count + other.count
        self.err = (self.err * self.count + other.err * other.count) / n
        self.bias = (self.bias * self.count + other.bias * other.count) / n
        if self.group_err is not None and other.group_err is not None:
            self.group_err = tuple((a * self.count + b * other.count) / n
                                   for a, b in zip(self.group_err, other.group_err))
        self.count = n
        if other.loss is not None:
            self.add_loss(other.loss, other.loss_count)

    def add_loss(self, loss: float, count: int = 1) -> None:
        """Average in a loss-aware score measured ``count`` times."""
        m = self.loss_count + count
        self.loss = ((self.loss or 0.0) * self.loss_count + loss * count) / m
        self.loss_count = m


def add_stat(table: dict[Candidate, Stat], c: Candidate, stat: Stat) -> None:
    """Record ``stat`` for candidate ``c``, averaged with what ``table`` holds for it already."""
    if c in table:
        table[c].merge(stat)
    else:
        table[c] = stat


@dataclass
class GemmTag:
    """What calibration needs to know of a GEMM node (stored in ``node.meta[TAG]``): its model-level key,
    the graph-local ``pair`` id of its site (to score the site's forward with this backward's gradient),
    which operands are gradient and weight, and its seeds."""

    key: GemmKey
    pair: tuple[int, int]
    grad_operand: int | None
    weight_operand: int | None
    seeds: tuple[int, int]
    layout: str | None = None  # grouped (experts) GEMMs: their layout


@dataclass
class Calibration:
    """Measurements of one model, from every graph that ran in calibration mode, keyed by GEMM key."""

    mx_scale: str = "rceil"
    rht_seed: int = 0
    scope: str = "eligible"  # which candidates are measured (options.measure, candidates.measured; "amax": none)
    menu: tuple[str, ...] | None = None  # the formats the hardware's plans may choose (None: every format)
    stats: dict[GemmKey, dict[Candidate, Stat]] = field(default_factory=dict)
    problems: dict[GemmKey, str] = field(default_factory=dict)  # why a GEMM could not be measured
    # grouped GEMMs: (sum of each expert's token count over the measurements, number of measurements)
    group_tokens: dict[GemmKey, tuple[list[int], int]] = field(default_factory=dict)
    # forward GEMMs: the max |x| seen of each activation operand (a, b; None for the weight), the static
    # NVFP4 tensor amax of option activation_scale="static"
    amaxes: dict[GemmKey, list[float | None]] = field(default_factory=dict)
    # a forward GEMM's normalised exact product and candidates' errors, its output shape and measured part
    _fwd_error: dict[tuple[int, int], tuple[GemmKey, torch.Tensor, dict[Candidate, torch.Tensor], tuple, Sample]] = (
        field(default_factory=dict))
    # what the last calibration measured (option recalibrate_every): kept for GEMMs the new one does not see
    _last: tuple[dict, dict, dict] = field(default_factory=lambda: ({}, {}, {}))

    def emulate(self, a: torch.Tensor, b: torch.Tensor, bias, c: Candidate, tag: GemmTag,
                sample: Sample = Sample(), cache: dict | None = None) -> torch.Tensor:
        """The product the rewritten graph would compute under candidate ``c``, in fp32; of a ``sample``,
        only that part of it (``bias``: already sampled). The sampled parts of the operands are quantized
        with the whole operands' scales and SR bits: exactly what the graph computes there. ``cache``
        shares operand quantizations and their decoded values between the candidates of one GEMM."""
        if c.fmt == "bf16":
            return scaled_mm(sample.pick(a, 0).bfloat16(), sample.pick(b, 1).bfloat16(), bias)
        cache = {} if cache is None else cache
        keys, tiled = [], []
        for which, x in enumerate((a, b)):
            spec = operand_spec(c, which, x.ndim, tag.grad_operand, tag.weight_operand, self.mx_scale)
            key = (which, spec)
            if key not in cache:  # 16x16 weight tiles tie rows: those are quantized whole, then sampled
                part = {} if spec.tile2d else sample.part(which, x.ndim)
                cache[key] = dispatch.quantize(x, spec.fmt, spec.axis, seed=tag.seeds[which],
                                               rht_signs=rht_signs(self.rht_seed), **spec.kwargs(), **part)
            keys.append(key)
            tiled.append(spec.tile2d)
        if sample.whole:
            return scaled_mm(cache[keys[0]], cache[keys[1]], bias)
        for which, key in enumerate(keys):
            if (key, "values") not in cache:
                values = dispatch.dequantize(cache[key])
                cache[key, "values"] = sample.pick(values, which) if tiled[which] else values
        y = torch.matmul(cache[keys[0], "values"], cache[keys[1], "values"])
        return y if bias is None else y + bias

    def emulate_grouped(self, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None, c: Candidate,
                        tag: GemmTag) -> torch.Tensor:
        """The fp32 product the rewritten grouped GEMM would compute under candidate ``c``."""
        opts = grouped_config(c, tag.grad_operand, tag.weight_operand)
        return grouped_mm(a, b, offs, c.fmt, **opts, rht_signs=rht_signs(self.rht_seed) if c.rht else None,
                          seeds=tag.seeds, scale_mode=self.mx_scale, out_dtype=torch.float32)

    def measure(self, tag: GemmTag, role: MatmulRole, a: torch.Tensor, b: torch.Tensor, bias,
                offs: torch.Tensor | None = None, product: torch.Tensor | None = None) -> None:
        """Score every candidate of one GEMM on its operands (``offs``: a grouped GEMM's groups;
        ``product``: the GEMM's own output in the graph, reused as the exact product when it is fp32)."""
        a32, b32 = a.detach().float(), b.detach().float()
        bias32 = None if bias is None else bias.detach().float()
        if product is not None and (product.dtype, product.shape) != (torch.float32, (*a.shape[:-1], b.shape[-1])):
            product = None
        problem = non_finite(a32, b32, bias32, product)
        if problem:
            self.problems[tag.key] = problem
            self._fwd_error.pop(tag.pair, None)
            return
        if role is MatmulRole.FPROP:
            self._note_amax(tag, (a32, b32))
        if self.scope == "amax":
            return
        if tag.layout is not None:
            full = grouped_mm(a32.double(), b32.double(), offs)
            sample = Sample(rows=sampled_rows(full.flatten(0, -2).shape[0]))
            exact = sample.pick(full.flatten(0, -2), 2)
            self._count_tokens(tag.key, offs)
        else:
            sample = Sample.of(a32.shape, b32.shape)
            bias32 = sample.pick(bias32, 1)
            exact = exact_product(sample.pick(a32, 0), sample.pick(b32, 1), bias32, sample.pick(product, 2))
        if exact.numel() == 0 or a32.shape[-1] == 0:
            return  # an empty batch tells nothing; a later step (or none: BF16, said so) decides
        scale = scale_of(exact)
        exact = exact / scale  # the candidates' errors are computed in its dtype
        # shared by the candidates: the signal's energy and Σ|Y| (the bias is Σ(Ŷ-Y)·sign(Y) / Σ|Y|), sign(Y), -Y
        energy, abs_sum, sign, neg_exact = dot(exact, exact), float(exact.abs().sum()), exact.sign(), exact.neg()
        has_weight = tag.weight_operand is not None
        errors, cache = {}, {}
        out = self.stats.setdefault(tag.key, {})
        # an operand quantized in parts is first laid out with its blocks contiguous (cut from there, the
        # parts are cheap); one quantized whole (or by the grouped GEMM) is read in place
        qa, qb = (blocked_copy(x, x.ndim - 1 - which)
                  if tag.layout is None and any(sample.part(which, x.ndim).values()) else x
                  for which, x in enumerate((a32, b32)))
        for c in measured(role, has_weight, self.scope, self.menu):
            if not blockable(a32, b32, c, tag.weight_operand, tag.layout):
                continue
            per_group = None
            if tag.layout is not None:
                y = self.emulate_grouped(a32, b32, offs, c, tag)
                per_group = group_errors(y.double(), full, offs, tag.layout)
                y = sample.pick(y.flatten(0, -2), 2)
            else:
                y = self.emulate(qa, qb, bias32, c, tag, sample, cache)
            diff = normalized_error(y, scale, neg_exact)
            add_stat(out, c, Stat(ratio(dot(diff, diff), energy), ratio(dot(diff, sign), abs_sum),
                                  group_err=per_group))
            errors[c] = diff
        if role is MatmulRole.FPROP and tag.layout in (None, "2d3d"):  # rows of the output are tokens
            full_shape = (*a32.shape[:-1], b32.shape[-1])
            self._fwd_error[tag.pair] = (tag.key, exact, errors, full_shape, sample)
        elif tag.grad_operand is not None and tag.pair in self._fwd_error:
            self._loss_scores(tag.pair, (a32, b32)[tag.grad_operand])

    def _note_amax(self, tag: GemmTag, operands: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Raise the recorded amax of each activation operand of a forward GEMM to this run's."""
        seen = self.amaxes.setdefault(tag.key, [None, None])
        for which, x in enumerate(operands):
            if which != tag.weight_operand and x.numel():
                seen[which] = max(seen[which] or 0.0, float(x.abs().max()))

    def _count_tokens(self, key: GemmKey, offs: torch.Tensor | None) -> None:
        if offs is None:
            return
        sizes = [e - s for s, e in group_bounds(offs, int(offs.max()) if offs.numel() else 0)]
        total, n = self.group_tokens.get(key, ([0] * len(sizes), 0))
        self.group_tokens[key] = ([t + s for t, s in zip(total, sizes)], n + 1)

    def tokens_per_group(self, key: GemmKey) -> tuple[float, ...] | None:
        """Mean token count of each expert over the measurements of a grouped GEMM (None if unmeasured)."""
        if key not in self.group_tokens:
            return None
        total, n = self.group_tokens[key]
        return tuple(t / n for t in total)

    def _loss_scores(self, pair: tuple[int, int], grad: torch.Tensor) -> None:
        fprop_key, exact, errors, full_shape, sample = self._fwd_error[pair]
        if grad.shape != full_shape:
            grad = grad.transpose(-1, -2)
        if grad.shape != full_shape:
            return
        grad = sample.pick(grad, 2).to(exact.dtype)  # where the forward's error was measured
        g = grad / scale_of(grad)
        ge = g * exact
        denom = dot(ge, ge)
        stats = self.stats[fprop_key]
        for c, diff in errors.items():
            gd = g * diff
            stats[c].add_loss(ratio(dot(gd, gd), denom))
        del self._fwd_error[pair]

    def merge(self, other: "Calibration") -> None:
        """Add another calibration's measurements (another rank's) to these."""
        for key, by_cand in other.stats.items():
            mine = self.stats.setdefault(key, {})
            for c, stat in by_cand.items():
                add_stat(mine, c, stat)
        for key, why in other.problems.items():
            self.problems.setdefault(key, why)
        for key, (total, n) in other.group_tokens.items():
            mine, m = self.group_tokens.get(key, ([0] * len(total), 0))
            self.group_tokens[key] = ([x + y for x, y in zip(mine, total)], m + n)
        for key, theirs in other.amaxes.items():
            mine = self.amaxes.setdefault(key, [None, None])
            self.amaxes[key] = [y if x is None else x if y is None else max(x, y) for x, y in zip(mine, theirs)]

    def restart(self) -> None:
        """A re-calibration begins: its measurements replace these, GEMM by GEMM, when ``keep_unmeasured``
        is called; a GEMM it does not see (a graph that did not run) keeps its last scores."""
        last_stats, last_problems, last_tokens = self._last
        self._last = ({**last_stats, **self.stats}, {**last_problems, **self.problems},
                      {**last_tokens, **self.group_tokens})
        self.stats, self.problems, self.group_tokens = {}, {}, {}
        self._fwd_error.clear()

    def keep_unmeasured(self) -> None:
        """Take the last calibration's scores (or problem) for every GEMM this one did not measure."""
        last_stats, last_problems, last_tokens = self._last
        for key in {*last_stats, *last_problems} - {*self.stats, *self.problems}:
            if key in last_stats:
                self.stats[key] = last_stats[key]
            if key in last_problems:
                self.problems[key] = last_problems[key]
            if key in last_tokens:
                self.group_tokens[key] = last_tokens[key]

    def end_run(self, graph: int) -> None:
        """A calibrating run of graph ``graph`` (its backward, or an inference call) has ended: forget
        its forward errors that no backward scored."""
        for pair in [p for p in self._fwd_error if p[0] == graph]:
            del self._fwd_error[pair]
