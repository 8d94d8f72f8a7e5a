"""Analysis pass: every matmul node of an aten graph, with its operands, shape and module."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

import autoprec.kernels.ops  # noqa: F401  (registers torch.ops.autoprec)
from autoprec.kernels.dispatch.grouped_mm import EXACT, grouped_layout

aten = torch.ops.aten
MATMUL_OPS = {aten.mm.default: "mm", aten.addmm.default: "addmm", aten.bmm.default: "bmm"}
SDPA_NAME = "scaled_dot_product_attention"


@dataclass(frozen=True)
class MatmulNode:
    """One matmul node: ``out = a @ b (+ bias)``, a (..., M, K) and b (..., K, N)."""

    node: fx.Node
    a: fx.Node
    b: fx.Node
    bias: fx.Node | None
    m: object
    n: object
    k: object
    batch: object | None
    module_id: str | None
    module_path: str
    module_type: str
    seq_nr: int | None
    sdpa: bool
    stack_ids: tuple[str, ...] = ()
    offs: fx.Node | None = None  # grouped GEMMs: the groups' cumulative ends
    groups: int | None = None  # grouped GEMMs: the number of groups (experts)
    layout: str | None = None  # grouped GEMMs: 2d3d, 2d2d or 3d3d (kernels/dispatch/grouped_mm.py)

    @property
    def name(self) -> str:
        return self.node.name


def _stack(node: fx.Node) -> dict:
    return node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}


def module_entry(node: fx.Node) -> tuple[str | None, str, str]:
    """(id, frame-relative path, class name) of the innermost nn.Module the node came from."""
    stack = _stack(node)
    if not stack:
        return None, "", ""
    key, (path, cls) = list(stack.items())[-1]
    rel = path.split(".", 1)[1] if "." in path else ""
    return key, rel, getattr(cls, "__name__", str(cls))


def _from_sdpa(node: fx.Node) -> bool:
    for key in ("source_fn_stack", "fwd_source_fn_stack"):
        for name, _ in node.meta.get(key) or []:
            if name == SDPA_NAME:
                return True
    return False


def is_fused_sdpa(node: fx.Node) -> bool:
    """A fused attention kernel node (its matmuls are inside the kernel)."""
    return node.op == "call_function" and "scaled_dot_product" in str(node.target) and "attention" in str(node.target)


def find_matmuls(graph: fx.Graph) -> list[MatmulNode]:
    """All mm / addmm / bmm nodes, grouped (experts) GEMMs and fused attention kernels, in graph order
    (nn.Linear, ``@``, F.linear and bmm-lowered einsum all reach aten as mm / addmm / bmm)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    found = _plain_matmuls(graph) + find_grouped(graph) + find_fused_sdpa(graph)
    return sorted(found, key=lambda mm: order[mm.node])


def grouped_operands(node: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node | None, str] | None:
    """(a, b, offs, layout) of a grouped GEMM autoprec plans: ``aten._grouped_mm`` without bias or
    out_dtype, or an exact ``autoprec.grouped_mm`` (the normalized transformers op); None otherwise."""
    if node.op != "call_function":
        return None
    if node.target is aten._grouped_mm.default:
        names = ("self", "mat2", "offs", "bias", "out_dtype")
        args = {**dict(zip(names, node.args)), **node.kwargs}
        if args.get("bias") is not None or args.get("out_dtype") is not None:
            return None
        a, b, offs = args["self"], args["mat2"], args.get("offs")
    elif node.target is torch.ops.autoprec.grouped_mm.default and node.args[3] == EXACT:
        a, b, offs = node.args[:3]
    else:
        return None
    layout = grouped_layout(a.meta["val"].ndim, b.meta["val"].ndim, offs is not None)
    return None if layout is None else (a, b, offs, layout)


def find_grouped(graph: fx.Graph) -> list[MatmulNode]:
    """Grouped GEMMs as (M, N, K) = (tokens, out, in) for 2d x 3d, (rows, cols, tokens) for the 2d x 2d
    wgrad layout (its K is the total of every group's tokens), and a batch of experts for 3d x 3d."""
    found = []
    for node in graph.nodes:
        ops = grouped_operands(node)
        if ops is None:
            continue
        a, b, offs, layout = ops
        av, bv = a.meta["val"], b.meta["val"]
        groups = offs.meta["val"].shape[0] if offs is not None else av.shape[0]
        mid, path, cls = module_entry(node)
        found.append(MatmulNode(
            node, a, b, None, av.shape[-2], bv.shape[-1], av.shape[-1], av.shape[0] if layout == "3d3d" else None,
            mid, path, cls, node.meta.get("seq_nr"), False, tuple(_stack(node)), offs, groups, layout,
        ))
    return found


def _plain_matmuls(graph: fx.Graph) -> list[MatmulNode]:
    found = []
    for node in graph.nodes:
        kind = MATMUL_OPS.get(node.target) if node.op == "call_function" else None
        if kind is None:
            continue
        if kind == "addmm":
            bias, a, b = node.args[:3]
            if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
                bias = None  # scaled addmm: treated as not rewritable by the assign pass
        else:
            (a, b), bias = node.args[:2], None
        av, bv = a.meta["val"], b.meta["val"]
        mid, path, cls = module_entry(node)
        found.append(MatmulNode(
            node, a, b, bias, av.shape[-2], bv.shape[-1], av.shape[-1],
            av.shape[0] if kind == "bmm" else None, mid, path, cls, node.meta.get("seq_nr"), _from_sdpa(node),
            tuple(_stack(node)),
        ))
    return found


def find_fused_sdpa(graph: fx.Graph) -> list[MatmulNode]:
    """Fused attention nodes (forward and backward kernels) as sites of two batched GEMMs each:
    Q·Kᵀ shown with (M, N, K) = (T_q, T_k, head dim) over batch x heads."""
    found = []
    for node in graph.nodes:
        if not is_fused_sdpa(node):
            continue
        q, k = node.args[:2] if "backward" not in str(node.target) else node.args[1:3]
        qv, kv = q.meta["val"], k.meta["val"]
        mid, path, cls = module_entry(node)
        batch = qv.shape[0] * qv.shape[1] if qv.ndim == 4 else qv.shape[0]
        found.append(MatmulNode(node, q, k, None, qv.shape[-2], kv.shape[-2], qv.shape[-1], batch,
                                mid, path, cls, node.meta.get("seq_nr"), True, tuple(_stack(node))))
    return found
