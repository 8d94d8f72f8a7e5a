"""Analysis pass: matmul-like ops that autoprec does not plan (grouped GEMMs with a bias or a 3d x 2d
layout, custom matmul ops, baddbmm, ...), with their FLOPs where the shapes tell them and the parameters
that feed them, so the plan can say what it did not see instead of reporting a share of the FLOPs it did."""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.fx as fx

from autoprec.passes.classify_roles import view_source
from autoprec.passes.find_matmuls import MATMUL_OPS, grouped_operands, module_entry

aten = torch.ops.aten
MATMUL_LIKE = {
    aten._grouped_mm.default, aten.baddbmm.default, aten.addbmm.default, aten.mv.default, aten.addmv.default,
    aten.dot.default, aten.vdot.default, aten.einsum.default, aten.matmul.default, aten.linear.default,
    aten._scaled_mm.default, aten._scaled_grouped_mm.default,
}
OWN_NAMESPACES = ("aten", "prims", "autoprec")
CUSTOM_MATMUL_NAME = re.compile(r"mm|matmul|gemm|linear")
GATHER_OPS = {aten.index.Tensor, aten.index_select.default, aten.gather.default}


@dataclass(frozen=True)
class UnplannedOp:
    """One matmul-like node autoprec leaves as it is."""

    node: fx.Node
    op: str
    module_path: str
    module_id: str | None
    flops: float | None
    params: tuple[fx.Node, ...]


def is_matmul_like(node: fx.Node) -> bool:
    """A matmul-like op that is not one of the mm / addmm / bmm autoprec plans."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or target in MATMUL_OPS:
        return False
    if grouped_operands(node) is not None:  # planned as a grouped GEMM
        return False
    if target in MATMUL_LIKE:
        return True
    return target.namespace not in OWN_NAMESPACES and bool(CUSTOM_MATMUL_NAME.search(target._schema.name))


def _shape(x) -> tuple | None:
    val = x.meta.get("val") if isinstance(x, fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _flops(node: fx.Node) -> float | None:
    """2·(output elements)·K when the output keeps the first operand's leading dims and K is its last
    (a token-major forward product, grouped or not); None when the shapes do not say."""
    tensors = [a for a in node.args if _shape(a) is not None]
    out = node.meta.get("val")
    out = out[0] if isinstance(out, (tuple, list)) and out else out
    if not tensors or not isinstance(out, torch.Tensor) or out.ndim == 0:
        return None
    a = _shape(tensors[1] if node.target in (aten.baddbmm.default, aten.addbmm.default, aten.addmv.default)
               and len(tensors) > 1 else tensors[0])
    if a is None or len(a) < 1 or tuple(out.shape[:-1]) != a[:-1]:
        return None
    try:
        return 2.0 * float(out.numel()) * float(a[-1])
    except (TypeError, ValueError):  # symbolic sizes without a hint
        return None


def gathered_source(operand: fx.Node) -> fx.Node | None:
    """The stack of expert weights (3D or more) a GEMM operand gathers from (``w[expert_ids]``, through
    views), or None; a 2D table looked up by index is an embedding, not an expert stack."""
    src = view_source(operand)
    if src.op != "call_function" or src.target not in GATHER_OPS or not isinstance(src.args[0], fx.Node):
        return None
    table = view_source(src.args[0])
    return table if len(_shape(table) or ()) >= 3 else None


def find_unplanned(graph: fx.Graph, params: set[fx.Node]) -> list[UnplannedOp]:
    """Every matmul-like op of the graph that autoprec does not rewrite, with the parameters it reads."""
    out = []
    for node in graph.nodes:
        if not is_matmul_like(node):
            continue
        inputs = [a for a in node.args if isinstance(a, fx.Node)]
        feeding = tuple(dict.fromkeys(s for s in map(view_source, inputs) if s in params))
        mid, path, _ = module_entry(node)
        out.append(UnplannedOp(node, str(node.target).removesuffix(".default"), path, mid, _flops(node), feeding))
    return out
