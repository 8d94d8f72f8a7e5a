"""Analysis pass: the GEMMs of one graph as the planner's ``GemmSpec`` (``autoprec.planner.gemm_spec``), each
tied to its node by a ``GraphGemm``. See docs/planner.md for the key every graph names a GEMM by."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy
from torch.fx.experimental.symbolic_shapes import statically_known_true

from autoprec.formats import FORMATS, get_format
from autoprec.kernels.dispatch.grouped import grouped_format_problem
from autoprec.passes.classify_roles import RoleInfo
from autoprec.passes.group_sites import Site
from autoprec.planner.gemm_spec import GemmSpec


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


@dataclass
class GraphGemm:
    """A GEMM node of one graph with its spec."""

    spec: GemmSpec
    info: RoleInfo
    pair: int  # graph-local id of its site: ties backward GEMMs to their fprop during calibration


def blocking_problem(k, fmt_name: str, layout: str | None = None) -> str | None:
    """Why a GEMM with reduction size ``k`` (a grouped GEMM's ``layout``) cannot take blocks of the block format
    ``fmt_name``; a grouped wgrad (2d x 2d) pads its token groups, so any K goes."""
    fmt = get_format(fmt_name)
    if layout is not None and grouped_format_problem(fmt.name):
        return grouped_format_problem(fmt.name)
    if layout == "2d2d":
        return None
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
                blocking={f: blocking_problem(mm.k, f, mm.layout) for f, fmt in FORMATS.items() if fmt.quantized},
                groups=mm.groups, layout=mm.layout,
            )
            out.append(GraphGemm(spec, info, site.index))
    return out
