"""Assignment pass: a fixed recipe's format for every GEMM, with BF16 where a shape or op forbids it."""
from __future__ import annotations

import torch.fx as fx
from autoprec.passes.classify_roles import RoleInfo
from autoprec.passes.group_sites import Site
from torch.fx.experimental.symbolic_shapes import statically_known_true

from autoprec.formats import get_format
from autoprec.options import CompileOptions
from autoprec.plan import Decision

SDPA_REASON = "fused scaled_dot_product_attention: left to its kernel, in the input dtype"


def _blocking_problem(info: RoleInfo, fmt_name: str) -> str | None:
    """Why this GEMM cannot take ``fmt_name`` blocks (None when it can)."""
    fmt = get_format(fmt_name)
    if not fmt.quantized:
        return None
    k = info.mm.k
    if isinstance(k, int):
        if k % fmt.block_size:
            return f"K={k} is not a multiple of the {fmt.name} block {fmt.block_size}"
        return None
    if not statically_known_true(k % fmt.block_size == 0):
        return f"K={k} is dynamic and not provably a multiple of the {fmt.name} block {fmt.block_size}"
    return None


def decide(site: Site, info: RoleInfo, fmt: str, reason: str, seed: int, **kw) -> Decision:
    """A Decision for one GEMM: ``fmt`` unless the site is fused SDPA or its blocking fails."""
    mm = info.mm
    shape = (str(mm.m), str(mm.n), str(mm.k))
    batch = None if mm.batch is None else str(mm.batch)
    base = dict(site=site.index, module=site.module_path, role=info.role, shape=shape, batch=batch,
                seeds=(seed, seed + 1))
    if site.sdpa:
        return Decision(fmt="bf16", reason=SDPA_REASON, rewritten=False, **base)
    if mm.node.target.__name__.startswith("addmm") and mm.bias is None:
        return Decision(fmt="bf16", reason="addmm with alpha/beta scaling: not rewritten", rewritten=False, **base)
    problem = _blocking_problem(info, fmt)
    if problem:
        return Decision(fmt="bf16", reason=f"{problem}: BF16 instead of {fmt}", **base)
    return Decision(fmt=fmt, reason=reason, **base, **kw)


def assign_recipe(sites: list[Site], opts: CompileOptions) -> dict[fx.Node, Decision]:
    """Every GEMM in the recipe's format, round-to-nearest, 1x16 scales, no RHT."""
    out = {}
    for site in sites:
        for info in site.gemms:
            seed = opts.seed + 2 * len(out)
            out[info.mm.node] = decide(site, info, opts.recipe, f"recipe {opts.recipe}", seed)
    return out
