"""User overrides: ``autoprec.annotate`` on modules and glob rules from ``options["overrides"]``.

Both win over the solver and over presets; the plan names them as the reason.
"""
from __future__ import annotations

import fnmatch
import weakref
from dataclasses import dataclass

import torch

from autoprec.formats import closest, get_format
from autoprec.roles import MatmulRole

ROLE_KEYS = ("fprop", "dgrad", "wgrad")
_ANNOTATIONS: dict[str, tuple[weakref.ref, dict[str, str]]] = {}


def _check_fmt(fmt: str, where: str) -> str:
    try:
        return get_format(fmt).name
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{where}: {exc}") from exc


def add_annotation(module: torch.nn.Module, fmt: str | None, per_role: dict[str, str | None]) -> str:
    """Checks and stores ``autoprec.annotate``'s formats for ``module`` (until it is freed); returns its key."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"annotate needs an nn.Module, got {type(module).__name__}")
    if fmt is not None and any(v is not None for v in per_role.values()):
        raise ValueError("annotate: give one format for all roles, or per-role formats, not both")
    if fmt is None and all(v is None for v in per_role.values()):
        raise ValueError("annotate: give a format, e.g. annotate(m, 'bf16') or annotate(m, wgrad='mxfp8')")
    where = f"annotate({type(module).__name__})"
    chosen = {r: _check_fmt(fmt, where) for r in ROLE_KEYS} if fmt else {
        r: _check_fmt(v, where) for r, v in per_role.items() if v is not None}
    key = str(id(module))
    _ANNOTATIONS[key] = (weakref.ref(module, lambda _: _ANNOTATIONS.pop(key, None)), chosen)
    return key


def annotated_modules() -> list[tuple[torch.nn.Module, dict[str, str]]]:
    """The live annotated modules with their {role: format}."""
    return [(m, spec) for ref, spec in list(_ANNOTATIONS.values()) if (m := ref()) is not None]


@dataclass(frozen=True)
class GemmOwner:
    """What ties a GEMM to real modules: the module stack it was traced in (ids), the id of its weight
    parameter, and the ids of its frame's parameters. One compiled graph can run for several module
    instances (after a graph break), so parameters, not trace-time stacks, decide where they can."""

    stack_ids: tuple[str, ...] = ()
    weight_id: int | None = None
    frame_params: frozenset[int] = frozenset()


def annotation_for(owner: GemmOwner, role: MatmulRole) -> tuple[str, str] | None:
    """(format, reason) pinned by the innermost annotated module holding a GEMM: the one owning its
    weight; for a GEMM without weight, the innermost annotated module on its stack, else the smallest
    annotated module holding all of its frame's parameters (e.g. the compiled root)."""
    live = [(m, spec) for m, spec in annotated_modules() if str(role) in spec]
    if not live:
        return None
    if owner.weight_id is not None:
        holders = [(m, spec) for m, spec in live if any(id(p) == owner.weight_id for p in m.parameters())]
    else:
        by_id = {str(id(m)): (m, spec) for m, spec in live}
        on_stack = [by_id[mid] for mid in owner.stack_ids if mid in by_id]
        holders = on_stack[-1:] or [(m, spec) for m, spec in live if owner.frame_params
                                    and owner.frame_params <= {id(p) for p in m.parameters()}]
    if not holders:
        return None
    module, spec = min(holders, key=lambda h: sum(p.numel() for p in h[0].parameters()))
    return spec[str(role)], f"override: annotate({type(module).__name__}) {role}"


def parse_rules(rules: dict) -> list[tuple[str, dict[str, str]]]:
    """Validate ``{"glob": fmt | {role: fmt}}`` into (pattern, {role: fmt}) in the given order."""
    out = []
    for pattern, spec in rules.items():
        where = f"autoprec option overrides[{pattern!r}]"
        if isinstance(spec, str):
            out.append((pattern, {r: _check_fmt(spec, where) for r in ROLE_KEYS}))
            continue
        if not isinstance(spec, dict):
            raise TypeError(f"{where} must be a format or a {{role: format}} dict, got {type(spec).__name__}")
        for role in spec:
            if role not in ROLE_KEYS:
                raise ValueError(f"{where}: unknown role {role!r}; valid roles: {', '.join(ROLE_KEYS)}")
        out.append((pattern, {r: _check_fmt(f, where) for r, f in spec.items()}))
    return out


def rule_for(rules: list[tuple[str, dict[str, str]]], module: str, role: MatmulRole) -> tuple[str, str] | None:
    """(format, reason) of the last glob rule matching ``module`` for ``role``."""
    hit = None
    for pattern, spec in rules:
        if fnmatch.fnmatchcase(module, pattern) and str(role) in spec:
            hit = spec[str(role)], f"override: {pattern!r} {role}"
    return hit


def check_rules_match(rules: list[tuple[str, dict[str, str]]], modules: list[str]) -> None:
    """Every rule must name at least one module of the model; otherwise say which names are close."""
    for pattern, _ in rules:
        if not any(fnmatch.fnmatchcase(m, pattern) for m in modules):
            raise ValueError(
                f"autoprec option overrides: {pattern!r} matches no module of this model; "
                f"closest: {closest(pattern, sorted(set(modules)) or ['<none>'])}"
            )
