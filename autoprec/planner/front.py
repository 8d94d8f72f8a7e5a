"""The speed-damage front of one calibration: the solver run again for a range of projected at-scale speedups,
without training or measuring again, so a user can pick a point. See docs/planner.md."""
from __future__ import annotations

import io
from dataclasses import dataclass, replace

from .assign import Assigner, damage
from .model_planner import ModelPlanner
from .plan import Plan


@dataclass(frozen=True)
class FrontPoint:
    """One re-solve: the speedup asked for, the at-scale and roofline speedups the plan projects, the mean damage
    per GEMM the solver weighed (the unit of ``budget``) and the FLOP share per format."""

    target: float
    at_scale: float
    roofline: float
    damage: float
    shares: dict[str, float]


@dataclass(frozen=True)
class Front:
    """The points of a front, slowest first."""

    points: tuple[FrontPoint, ...]

    def table(self) -> str:
        lines = [f"{'target':>7} {'at scale':>9} {'roofline':>9} {'damage/GEMM':>12}  FLOPs"]
        for p in self.points:
            shares = ", ".join(f"{fmt} {100 * s:.0f}%" for fmt, s in sorted(p.shares.items()))
            lines.append(f"{p.target:>6.2f}x {p.at_scale:>8.2f}x {p.roofline:>8.2f}x {p.damage:>12.2e}  {shares}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def plot(self, path: str) -> None:
        """A PNG of the mean damage per GEMM against the projected at-scale speedup (needs matplotlib: the
        ``bench`` or ``test`` extra)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise ImportError("Front.plot needs matplotlib: pip install 'autoprec[bench]'") from exc
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([p.at_scale for p in self.points], [p.damage for p in self.points], "o-")
        ax.set_xlabel("projected at-scale speedup vs BF16")
        ax.set_ylabel("mean damage per GEMM (budget units)")
        ax.set_title("autoprec: one calibration, re-solved")
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=120)
        plt.close(fig)
        with open(path, "wb") as f:
            f.write(buffer.getvalue())


def front(planner: ModelPlanner, points: int = 8) -> Front:
    """The solver of ``planner``'s fixed plan (recipe ``auto``) run again at ``points`` projected at-scale speedups
    from 1x to the most its calibration reaches (points the solver's time grid cannot reach are left out), GEMMs
    its options force kept as they are."""
    if planner.calibration is None or planner.opts.recipe != "auto" or not planner.calibration.stats:
        raise ValueError("autoprec.front needs a model compiled with recipe 'auto' that has calibrated (one call of "
                         "a compiled inference model, or one backward pass of a training one)")
    if points < 2:
        raise ValueError(f"autoprec.front: points must be at least 2, got {points}")
    specs = list(planner.specs.values())
    fastest = _assigner(planner, None)
    free = [g for g in specs if fastest.forced(g) is None and not g.sdpa]
    reach = (sum(fastest.at_scale.seconds(g, "bf16") for g in free)
             / sum(min(t for _, t, _ in fastest.options(g)) for g in free)) if free else 1.0
    targets = [1.0 + (reach - 1.0) * i / (points - 1) for i in range(points)]
    found = []
    for t in targets:
        try:
            found.append(_point(planner, specs, free, t))
        except ValueError:  # the solver's grid of times (rounded up) falls short of the fastest plans
            continue
    return Front(tuple(found))


def _assigner(planner: ModelPlanner, target: float | None) -> Assigner:
    return planner.assigner_with(replace(planner.opts, cost="at_scale", target_speedup=target))


def _point(planner: ModelPlanner, specs: list, free: list, target: float) -> FrontPoint:
    """The plan the solver makes at ``target`` and what it projects; the damage is the mean over the GEMMs the
    solver decides (``free``), as the budget counts it."""
    assigner = _assigner(planner, max(target, 1.0 + 1e-9))
    choices = assigner.choose(specs)
    sites = {}
    decisions = []
    for g in specs:
        sites.setdefault(g.key[0], len(sites))
        decisions.append(assigner.decision(g, choices[g.key], sites[g.key[0]]))
    stats = planner.calibration.stats
    damages = [damage(stats[g.key][c], g.role, planner.opts.damage_weights())
               for g, (c, _) in ((g, choices[g.key]) for g in free) if c in stats.get(g.key, {})]
    plan = Plan(decisions=decisions, hardware=planner.opts.hardware)
    return FrontPoint(target, plan.projected_speedup(at_scale=True), plan.projected_speedup(),
                      sum(damages) / max(len(free), 1), plan.flop_share())
