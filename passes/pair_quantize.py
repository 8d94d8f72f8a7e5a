"""Pairing pass: the two quantizations of one 2D tensor along its two dims become one quantize_dual node.

A layer's GEMMs quantize some tensors twice: an activation rowwise for fprop and columnwise for wgrad, an
output gradient rowwise for dgrad and (through a transpose) columnwise for wgrad, a weight with 1x16 or 1x32
blocks rowwise for fprop and columnwise for dgrad. ``autoprec.quantize_dual`` writes both copies from one
read of the tensor (the Triton kernel; elsewhere two quantizations of the same bytes). The node takes the
earlier quantization's place, so a copy a backward GEMM reads may be made in the forward and saved, as
Transformer Engine's quantizers do. A copy read through a transpose keeps the SR bits of its own source.
"""
from __future__ import annotations

import operator

import torch
from torch import fx

from autoprec.passes.rewrite import add_like

aten = torch.ops.aten
autoprec_ops = torch.ops.autoprec  # registered by autoprec.kernels.ops
QUANTIZE = autoprec_ops.quantize.default


def _transposed(node: fx.Node) -> fx.Node | None:
    """The 2D tensor a 2D transpose node reads, else None."""
    if node.op != "call_function" or node.meta["val"].ndim != 2:
        return None
    if node.target is aten.t.default:
        return node.args[0]
    if node.target is aten.permute.default and list(node.args[1]) in ([1, 0], [-1, -2]):
        return node.args[0]
    if node.target is aten.transpose.int and {d % 2 for d in node.args[1:3]} == {0, 1}:
        return node.args[0]
    return None


def pair_quantizations(gm: fx.GraphModule) -> int:
    """Replace each rowwise + columnwise pair of quantize nodes of one tensor (same format, scale rule, RHT
    signs and step; 1-D blocks) by a quantize_dual node; returns how many pairs were made."""
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    copies: dict[tuple, dict[int, tuple[fx.Node, bool]]] = {}
    for q in graph.find_nodes(op="call_function", target=QUANTIZE):
        x, fmt, axis, _, _, tile2d, scale_mode, _, rht_seed, step = q.args[:10]
        amax = q.args[10] if len(q.args) > 10 else None  # a static amax: paired only with a copy taking the same
        if tile2d or x.meta["val"].ndim != 2:
            continue
        base, transposed = x, False
        while (inner := _transposed(base)) is not None:  # t(t(W)) is W: a dgrad may read its fprop's view
            base, transposed = inner, not transposed
        dim = (axis % 2) ^ transposed  # the block dim in the untransposed tensor's coordinates
        key = (base, fmt, scale_mode, rht_seed, step, amax)
        copies.setdefault(key, {}).setdefault(dim, (q, transposed))
    pairs = 0
    for (base, fmt, scale_mode, rht_seed, step, amax), by_dim in copies.items():
        if len(by_dim) < 2:
            continue
        (qa, ta), (qb, tb) = by_dim[1], by_dim[0]
        first = min(qa, qb, key=order.__getitem__)
        args = (base, fmt, *_copy_args(qa, ta), *_copy_args(qb, tb), scale_mode, rht_seed, step)
        args = args if amax is None else (*args, amax)
        with graph.inserting_before(first):
            dual = add_like(graph, autoprec_ops.quantize_dual.default, args, first, first.meta.get("autoprec"))
        for q, offset in ((qa, 0), (qb, 3)):
            for user in list(q.users):
                assert user.target is operator.getitem, user
                user.args = (dual, offset + user.args[1])
            graph.erase_node(q)
        pairs += 1
    if pairs:
        graph.lint()
        gm.recompile()
    return pairs


def _copy_args(q: fx.Node, transposed: bool) -> tuple:
    """quantize_dual's (rounding, seed, rht, transposed) of the copy quantize node ``q`` made."""
    _, _, _, rounding, seed, _, _, rht, _, _ = q.args[:10]
    return rounding, seed, rht, transposed
