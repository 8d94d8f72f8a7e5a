"""Normalization pass: transformers' grouped-mm custom ops become ``autoprec.grouped_mm`` nodes.

transformers runs an fp32 (or any non-bf16) experts module under torch.compile through its opaque
custom ops ``transformers::grouped_mm_fallback(input, weight, offs)`` and, in the backward,
``transformers::grouped_mm_fallback_backward(input, weight, offs, grad)`` -> (grad_input, grad_weight).
They compute exactly ``aten._grouped_mm``'s 2d x 3d product and its two backward GEMMs. This pass
replaces each by ``autoprec.grouped_mm`` in ``exact`` mode (the same loop of ``torch.mm`` in the input
dtype), one node per GEMM, so the GEMMs are found, classified and planned like any grouped GEMM.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from autoprec.kernels.dispatch.grouped_mm import EXACT
from autoprec.passes.rewrite import add_like

aten = torch.ops.aten
FORWARD, BACKWARD = "transformers.grouped_mm_fallback.default", "transformers.grouped_mm_fallback_backward.default"


def _exact(graph: fx.Graph, a: fx.Node, b: fx.Node, offs: fx.Node, step: fx.Node, like: fx.Node) -> fx.Node:
    dtype = a.meta["val"].dtype
    args = (a, b, offs, EXACT, "rne", "rne", False, False, 0, 0, "rceil", 0, step, dtype)
    return add_like(graph, torch.ops.autoprec.grouped_mm.default, args, like)


def normalize_grouped(gm: fx.GraphModule, step: fx.Node) -> int:
    """Replace transformers' grouped-mm ops in ``gm``; returns how many GEMMs were made."""
    graph, made = gm.graph, 0
    for node in list(graph.nodes):
        target = str(node.target) if node.op == "call_function" else ""
        if target == FORWARD:
            x, w, offs = node.args[:3]
            with graph.inserting_before(node):
                out = _exact(graph, x, w, offs, step, node)
            node.replace_all_uses_with(out)
            graph.erase_node(node)
            made += 1
        elif target == BACKWARD:
            x, w, offs, grad = node.args[:4]
            with graph.inserting_before(node):
                wt = add_like(graph, aten.transpose.int, (w, -2, -1), node)
                dgrad = _exact(graph, grad, wt, offs, step, node)
                xt = add_like(graph, aten.t.default, (x,), node)
                wgrad = _exact(graph, xt, grad, offs, step, node)
            for user in list(node.users):
                if user.target is operator.getitem:
                    user.replace_all_uses_with((dgrad, wgrad)[user.args[1]])
                    graph.erase_node(user)
            graph.erase_node(node)
            made += 2
    if made:
        graph.lint()
        gm.recompile()
    return made
