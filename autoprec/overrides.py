"""User overrides: ``autoprec.annotate`` on modules and glob rules from ``options["overrides"]``.

Both win over the solver and over presets; the plan names them as the reason.
"""
from __future__ import annotations

import fnmatch
import weakref

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


def annotate(module: torch.nn.Module, fmt: str | None = None, *, fprop: str | None = None,
             dgrad: str | None = None, wgrad: str | None = None) -> None:
    """Pin the format of every GEMM in ``module`` (and its children): ``fmt`` for all roles, or per
    role with ``fprop=`` / ``dgrad=`` / ``wgrad=``. Call before the first compiled call."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"annotate needs an nn.Module, got {type(module).__name__}")
    per_role = {"fprop": fprop, "dgrad": dgrad, "wgrad": wgrad}
    if fmt is not None and any(v is not None for v in per_role.values()):
        raise ValueError("annotate: give one format for all roles, or per-role formats, not both")
    if fmt is None and all(v is None for v in per_role.values()):
        raise ValueError("annotate: give a format, e.g. annotate(m, 'bf16') or annotate(m, wgrad='mxfp8')")
    where = f"annotate({type(module).__name__})"
    chosen = {r: _check_fmt(fmt, where) for r in ROLE_KEYS} if fmt else {
        r: _check_fmt(v, where) for r, v in per_role.items() if v is not None}
    key = str(id(module))
    _ANNOTATIONS[key] = (weakref.ref(module, lambda _: _ANNOTATIONS.pop(key, None)), chosen)


def annotation_for(stack_ids: tuple[str, ...], role: MatmulRole) -> tuple[str, str] | None:
    """(format, reason) pinned by the innermost annotated module of a GEMM's module stack."""
    for mid in reversed(stack_ids):
        entry = _ANNOTATIONS.get(mid)
        if entry is not None and entry[0]() is not None and str(role) in entry[1]:
            return entry[1][str(role)], f"override: annotate({type(entry[0]()).__name__}) {role}"
    return None


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
    """Every rule must name at least one compiled module; otherwise say which names are close."""
    for pattern, _ in rules:
        if not any(fnmatch.fnmatchcase(m, pattern) for m in modules):
            raise ValueError(
                f"autoprec option overrides: {pattern!r} matches no module with a matmul; "
                f"closest: {closest(pattern, sorted(set(modules)) or ['<none>'])}"
            )
