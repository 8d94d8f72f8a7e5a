"""Public API: the plan of a compiled model, and its state for checkpoints."""
from __future__ import annotations

import re
import warnings

import torch

from autoprec.model_root import compiled_regions, holds, named_modules
from autoprec.planner.front import Front
from autoprec.planner.front import front as planner_front
from autoprec.planner.model_planner import (
    PLANNERS,
    ModelPlanner,
    defer_state,
    enclosing_planners,
    planned_module_ids,
    planned_weight_ids,
    planners_of,
)
from autoprec.planner.overrides import add_annotation, annotated_modules
from autoprec.planner.plan import Plan


def _root(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "_orig_mod", model)


def _model_plans(model: torch.nn.Module) -> tuple[torch.nn.Module, list, list[str]]:
    """(the model, its live plans, a note): a module compiled block by block inside a bigger one (regional
    compilation) is planned with the model it is part of, and the note says so."""
    root = _root(model)
    states = planners_of(root) or enclosing_planners(root)
    if not states or states[-1].model is root:
        return root, states, []
    note = (f"this {type(root).__name__} is part of a {type(states[-1].model).__name__} compiled module by module "
            "(regional compilation): these are that model's plan and names")
    return states[-1].model, states, [note]


def model_planner(model: torch.nn.Module, caller: str) -> ModelPlanner:
    """The planner of a compiled model (or of the model a compiled block belongs to); ``caller`` names who asks in
    the error for a model no compiled graph planned."""
    root, planners, _ = _model_plans(model)
    if not planners:
        raise ValueError(f"{caller}: no autoprec plan for this {type(root).__name__}: compile it with "
                         f"backend='autoprec' and call it once (a model dynamo ran eagerly has no plan)")
    return planners[-1]


def plan(model: torch.nn.Module, stage: int | None = None, *, phase: int | None = None) -> Plan:
    """The precision plan of a model compiled with ``backend="autoprec"``: one row per GEMM (root-relative
    module path, role, ordinal) with the graphs it runs in. Needs at least one call of the compiled
    model; when dynamo ran all of it eagerly (a skipped frame), the plan has no rows and says which
    modules ran eagerly and why. With a ``schedule``, the rows are those of schedule stage ``stage``
    (default: the stage running now) and every stage has a line under the table. ``phase`` is the older
    name of ``stage``."""
    if phase is not None:
        if stage is not None and stage != phase:
            raise ValueError(f"autoprec.plan: stage={stage} and phase={phase} name one thing; give one")
        stage = phase
    root, states, part_of = _model_plans(model)
    reasons = dynamo_fallback_reasons()
    if not states and not reasons:
        raise ValueError(
            f"no autoprec plan for this {type(root).__name__}: compile it with backend='autoprec' and call it once"
        )
    state = states[-1] if states else None
    result = state.to_plan(stage) if state is not None else Plan()
    seen = state.param_names if state is not None else set()
    weights = state.weight_names if state is not None else set()
    result.not_compiled = [
        name for name, m in named_modules(root, remove_duplicate=True)
        if (isinstance(m, torch.nn.Linear) and _full(name, "weight") not in weights)
        or any(p.ndim >= 2 and _full(name, pn) not in seen for pn, p in m.named_parameters(recurse=False))
    ]
    eager = set(result.not_compiled)
    regions = compiled_regions(root)
    outside = [n for n in result.not_compiled if regions and not any(_inside(n, r) for r in regions)]
    result.unplanned_params = [
        (_full(name, pn), OUTSIDE_WHY if name in outside else EAGER_WHY if name in eager
         else _why_unplanned(state, _full(name, pn)))
        for name, m in named_modules(root, remove_duplicate=True)
        for pn, p in m.named_parameters(recurse=False)
        if p.ndim >= 2 and _full(name, pn) not in weights and (name in eager or _full(name, pn) in seen)
    ]
    if outside:
        result.notes.append(f"regional compilation: {len(regions)} compiled modules ({_listed(regions)}); "
                            f"{', '.join(outside)} run outside the compiled modules, eagerly")
    if result.not_compiled and reasons:
        result.notes += [f"dynamo ran code eagerly: {r}" for r in reasons]
    result.notes += part_of + _annotation_notes(root)
    return result


EAGER_WHY = "ran eagerly (after a graph break or in a skipped frame): its GEMMs are not seen"
OUTSIDE_WHY = "outside the compiled modules (regional compilation): its GEMMs are not seen"


def _inside(name: str, region: str) -> bool:
    return name == region or name.startswith(region + ".")


def _listed(names: list[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f", ... {len(names) - most} more" if len(names) > most else "")


def _why_unplanned(state, name: str) -> str:
    """Why a parameter a compiled graph received feeds no planned GEMM as its weight."""
    if name in state.unplanned_params:
        return f"op not supported: {state.unplanned_params[name]}"
    if name in state.gathered_names:
        return "read through an index (gathered expert weights): its products are planned, but not as a weight"
    return "not a matmul (e.g. an embedding table)"


def _full(module: str, param: str) -> str:
    return f"{module}.{param}" if module else param


def state_dict(model: torch.nn.Module) -> dict:
    """What a checkpoint needs to resume a compiled model bit for bit: the call counter that seeds
    stochastic rounding and, once fixed, the plan (so a resumed ``auto`` run does not recalibrate)."""
    root, states, _ = _model_plans(model)
    if not states:
        raise ValueError(f"no autoprec state for this {type(root).__name__}: compile it and call it once")
    return states[-1].state_dict()


def load_state_dict(model: torch.nn.Module, state: dict) -> None:
    """Restore :func:`state_dict` into a model: call it after loading the weights and before the first
    compiled call, which then takes the counter and (for recipe ``auto``) the saved plan. On a model that
    has already run, only the counter is restored: its plan is fixed already."""
    if not isinstance(state, dict) or not isinstance(state.get("calls"), int) or "plan" not in state:
        raise ValueError("autoprec.load_state_dict: expected the dict autoprec.state_dict returned, with fields "
                         "'calls' (int) and 'plan'")
    root, states, _ = _model_plans(model)
    if states:
        states[-1].load_state_dict(state)
    else:
        defer_state(root, state)


def dynamo_fallback_reasons() -> list[str]:
    """Why dynamo ran code eagerly in this process (graph breaks, skipped frames): for each reason it
    counted, the headline and explanation of every break in the chain, and the frame it skipped."""
    from torch._dynamo.utils import counters

    out = []
    for key in (*counters["unimplemented"], *counters["graph_break"]):
        parts = []
        for chunk in str(key).split("*** While handling this graph break, another graph break occurred: ***"):
            lines = [ln.strip() for ln in chunk.strip().splitlines() if ln.strip()]
            if not lines:
                continue
            why = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Explanation:")), "")
            parts.append(f"{lines[0]} ({why})" if why else lines[0])
        skipped = re.search(r"frame skipped: ([^\n]+)", str(key))
        out.append("; then ".join(parts) + (f" [frame skipped: {skipped.group(1).strip()}]" if skipped else ""))
    # a chain's first break is also counted alone: keep the longest telling of each
    return [ln for i, ln in enumerate(out) if ln not in out[:i] and not any(ln != o and ln in o for o in out)]


def _annotation_notes(root: torch.nn.Module) -> list[str]:
    """Annotations on this model's modules that no planned GEMM ran in, and annotations on modules that
    belong to no compiled model at all: both were ignored."""
    modules = {str(id(m)): name for name, m in named_modules(root)}
    planned, weights = planned_module_ids(), planned_weight_ids()
    compiled_roots = [s.model for s in PLANNERS if s.model is not None]
    notes = []
    for module, spec in annotated_modules():
        what = f"annotate({type(module).__name__}, {', '.join(f'{r}={f}' for r, f in spec.items())})"
        name = modules.get(str(id(module)))
        in_plan = str(id(module)) in planned or any(id(p) in weights for p in module.parameters())
        if name is not None and not in_plan:
            notes.append(f"{what} on {name or '<root>'!r}: no planned GEMM runs in this module; ignored")
        elif name is None and not any(holds(r, module) for r in compiled_roots):
            notes.append(f"{what}: the module is not part of this (or any compiled) model; ignored")
    return notes


def refresh_weights() -> None:
    """Prepare every weight again at its next use in an RL inference graph (``phase`` ``rl_sampler`` or ``rl``).

    Those graphs keep each weight quantized once per weight version (``kernels/weight_cache.py``) and see every write
    that bumps the weight's version counter (an optimizer step, ``load_state_dict``, ``copy_``, FSDP2's all-gather)
    or moves its data (assignment to ``.data``). Call this after a write they cannot see: through ``param.data``
    (``param.data.copy_(...)``: ``.data`` is a tensor with a version counter of its own)."""
    from autoprec.kernels import weight_cache

    weight_cache.refresh()


def annotate(module: torch.nn.Module, fmt: str | None = None, *, fprop: str | None = None,
             dgrad: str | None = None, wgrad: str | None = None) -> None:
    """Pin the format of every GEMM in ``module`` (and its children): ``fmt`` for all roles, or per
    role with ``fprop=`` / ``dgrad=`` / ``wgrad=``.

    An annotation applies to the GEMMs planned after it, so call it before the first compiled call:
    GEMMs already planned keep their decision (a UserWarning says so) until the model is compiled
    anew (``torch._dynamo.reset()``). ``autoprec.plan`` lists annotations that matched no GEMM.
    """
    key = add_annotation(module, fmt, {"fprop": fprop, "dgrad": dgrad, "wgrad": wgrad})
    if key in planned_module_ids() or any(id(p) in planned_weight_ids() for p in module.parameters()):
        warnings.warn(f"autoprec.annotate({type(module).__name__}): GEMMs of this module are already planned in a "
                      f"compiled graph and keep their formats; the annotation applies to graphs compiled from now "
                      f"on (call torch._dynamo.reset() to compile anew, or annotate before the first call)",
                      UserWarning, stacklevel=2)


def front(model: torch.nn.Module, points: int = 8) -> Front:
    """The speed-damage front of a model compiled with recipe ``auto`` after it has calibrated: the solver run
    again, from the same measurements, at ``points`` projected at-scale speedups from 1x to the fastest it reaches.
    ``print`` it, or ``.plot("front.png")``; compile again with ``target_speedup`` set to the point you pick."""
    return planner_front(model_planner(model, "autoprec.front"), points)
