"""Public API: the plan of a compiled model."""
from __future__ import annotations

import gc
from dataclasses import replace

import torch

from autoprec.backend import RECORDS, GraphRecord
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
    by root-relative module path. Needs at least one call of the compiled model."""
    root = _root(model)
    params = {id(p): name for name, p in root.named_parameters(remove_duplicate=False)}
    modules = {str(id(m)): name for name, m in root.named_modules(remove_duplicate=False)}
    gc.collect()  # compiled graphs dropped by torch._dynamo.reset() (or recompiles) take their plans along
    RECORDS[:] = [r for r in RECORDS if r.alive]
    records = [r for r in RECORDS if r.param_ids & params.keys()]
    if not records:
        raise ValueError(
            f"no autoprec plan for this {type(root).__name__}: compile it with backend='autoprec' and call it once"
        )
    result = Plan(hardware=records[0].hardware)
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
    result.not_compiled = [
        name for name, m in root.named_modules() if isinstance(m, torch.nn.Linear) and id(m.weight) not in covered
    ]
    return result
