"""Analysis pass: fprop / dgrad / wgrad of each matmul by dataflow over the joint graph.

Backward matmuls are those reachable from the tangents (networkx descendants). Of a backward matmul,
the operand not reached from the tangents tells dgrad (it is a parameter seen through views and casts)
from wgrad (it is a forward activation and the product flows, through views and sums, into a
parameter's gradient output). Activation x activation products are fprop and dgrad only. The result
is cross-checked against the forward op's ``seq_nr`` that autograd stamps on backward nodes.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import torch
import torch.fx as fx

from autoprec.passes.find_matmuls import MatmulNode
from autoprec.roles import MatmulRole

aten = torch.ops.aten
VIEW_OPS = {
    aten.t.default, aten.transpose.int, aten.permute.default, aten.view.default, aten._unsafe_view.default,
    aten.reshape.default, aten.expand.default, aten.clone.default, aten.alias.default, aten.detach.default,
    aten.squeeze.dim, aten.unsqueeze.default, aten._to_copy.default, torch.ops.prims.convert_element_type.default,
}
ACCUMULATE_OPS = VIEW_OPS | {aten.add.Tensor}


@dataclass(frozen=True)
class RoleInfo:
    """The role of one matmul node and which operands are the weight and the gradient (0 = a, 1 = b)."""

    mm: MatmulNode
    role: MatmulRole
    weight_operand: int | None
    grad_operand: int | None
    weight_placeholder: fx.Node | None


def to_networkx(graph: fx.Graph) -> nx.DiGraph:
    g = nx.DiGraph()
    for node in graph.nodes:
        g.add_node(node)
        for user in node.users:
            g.add_edge(node, user)
    return g


def view_source(node: fx.Node) -> fx.Node:
    """Follow views and casts back to the tensor they show."""
    while node.op == "call_function" and node.target in VIEW_OPS and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def _reaches_param_grad(node: fx.Node, grad_outputs: set[fx.Node]) -> bool:
    todo, seen = [node], set()
    while todo:
        cur = todo.pop()
        if cur in grad_outputs:
            return True
        for user in cur.users:
            if user not in seen and user.op == "call_function" and user.target in ACCUMULATE_OPS:
                seen.add(user)
                todo.append(user)
            elif user in grad_outputs:
                return True
    return False


def classify_roles(
    graph: fx.Graph, matmuls: list[MatmulNode], params: set[fx.Node], param_grads: set[fx.Node]
) -> list[RoleInfo]:
    """Roles of ``matmuls``; ``params`` are the parameter placeholders, ``param_grads`` the nodes the
    joint graph returns as their gradients (empty for inference graphs)."""
    tangents = [n for n in graph.nodes if n.op == "placeholder" and "tangents" in n.name]
    g = to_networkx(graph)
    backward: set[fx.Node] = set(tangents)
    for t in tangents:
        backward |= nx.descendants(g, t)
    infos = []
    for mm in matmuls:
        srcs = (view_source(mm.a), view_source(mm.b))
        weight = next((i for i, s in enumerate(srcs) if s in params), None)
        wnode = srcs[weight] if weight is not None else None
        if mm.node not in backward:
            infos.append(RoleInfo(mm, MatmulRole.FPROP, weight, None, wnode))
            continue
        grad = 0 if mm.a in backward else 1
        other = 1 - grad
        if srcs[other] in params:
            infos.append(RoleInfo(mm, MatmulRole.DGRAD, other, grad, srcs[other]))
        elif _reaches_param_grad(mm.node, param_grads):
            infos.append(RoleInfo(mm, MatmulRole.WGRAD, None, grad, None))
        else:
            infos.append(RoleInfo(mm, MatmulRole.DGRAD, None, grad, None))
    return infos
