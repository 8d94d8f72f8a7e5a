"""Public API: the plan of a compiled model."""
from __future__ import annotations

import gc
import re
from dataclasses import replace

import torch

from autoprec.backend import RECORDS, GraphRecord, planned_module_ids, planned_weight_ids
from autoprec.overrides import annotated_modules
from autoprec.plan import Plan


def _root(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "_orig_mod", model)


def _prefix(record: GraphRecord, params: dict[int, str]) -> str | None:
    """The root-relative name of the module a record's graph was traced from (its frame's ``self``),
    read off any weight site: the parameter's real name minus the site's frame-relative path."""
    for d, wid in zip(record.decisions, record.weight_ids):
        if wid in params:
            owner = params[wid].rsplit(".", 1)[0] if "." in params[wid] else ""
            if d.module and owner.endswith(d.module):
                return owner[: len(owner) - len(d.module)]
            if not d.module:
                return owner + "." if owner else ""
    return None


def plan(model: torch.nn.Module) -> Plan:
    """The precision plan of a model compiled with ``backend="autoprec"``, one row per GEMM, named
    by root-relative module path. Needs at least one call of the compiled model; when dynamo ran all
    of it eagerly (a skipped frame), the plan has no rows and says which modules ran eagerly and why."""
    root = _root(model)
    params = {id(p): name for name, p in root.named_parameters(remove_duplicate=False)}
    modules = {str(id(m)): name for name, m in root.named_modules(remove_duplicate=False)}
    gc.collect()  # compiled graphs dropped by torch._dynamo.reset() (or recompiles) take their plans along
    RECORDS[:] = [r for r in RECORDS if r.alive]
    records = [r for r in RECORDS if r.param_ids & params.keys()]
    reasons = dynamo_fallback_reasons()
    if not records and not reasons:
        raise ValueError(
            f"no autoprec plan for this {type(root).__name__}: compile it with backend='autoprec' and call it once"
        )
    result = Plan(hardware=records[0].hardware if records else "gb300")
    covered: set[int] = set()
    for i, record in enumerate(records):
        prefix = _prefix(record, params)
        offset = 1 + max((d.site for d in result.decisions), default=-1)
        for d, mid in zip(record.decisions, record.module_ids):
            name = prefix + d.module if prefix is not None else modules.get(mid, d.module)
            result.decisions.append(replace(d, module=name.rstrip("."), site=d.site + offset))
        covered.update(w for w in record.weight_ids if w is not None)
        if record.saved_bytes is not None:
            result.saved_bytes[f"graph {i}"] = record.saved_bytes
        for name, seconds in record.timings.items():
            result.pass_seconds[name] = result.pass_seconds.get(name, 0.0) + seconds
        if record.failure:
            result.notes.append(f"a compiled graph ran as traced, without autoprec's formats: {record.failure}")
    in_graphs = set().union(*(r.param_ids for r in records)) if records else set()
    result.not_compiled = [
        name for name, m in root.named_modules()
        if (isinstance(m, torch.nn.Linear) and id(m.weight) not in covered)
        or any(p.ndim >= 2 and id(p) not in in_graphs for p in m.parameters(recurse=False))
    ]
    if result.not_compiled and reasons:
        result.notes += [f"dynamo ran code eagerly: {r}" for r in reasons]
    result.notes += _annotation_notes(root, modules)
    return result


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


def _annotation_notes(root: torch.nn.Module, modules: dict[str, str]) -> list[str]:
    """Annotations on this model's modules that no planned GEMM ran in, and annotations on modules that
    belong to no compiled model at all: both were ignored."""
    planned, weights = planned_module_ids(), planned_weight_ids()
    compiled_params = set().union(*(r.param_ids for r in RECORDS)) if RECORDS else set()
    notes = []
    for module, spec in annotated_modules():
        what = f"annotate({type(module).__name__}, {', '.join(f'{r}={f}' for r, f in spec.items())})"
        name = modules.get(str(id(module)))
        in_plan = str(id(module)) in planned or any(id(p) in weights for p in module.parameters())
        if name is not None and not in_plan:
            notes.append(f"{what} on {name or '<root>'!r}: no planned GEMM runs in this module; ignored")
        elif name is None and not any(id(p) in compiled_params for p in module.parameters()):
            notes.append(f"{what}: the module is not part of this (or any compiled) model; ignored")
    return notes
