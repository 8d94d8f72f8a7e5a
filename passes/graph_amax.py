"""Tensor-amax pass: NVFP4's tensor amax of a quantized tensor computed by graph ops, where inductor compiles the
graph, instead of by the quantize op's own pass over the tensor.

An NVFP4 quantization needs max|x| over the whole tensor before its first block is encoded, so the Triton
quantizers read x twice: an amax pass (after zeroing its cell), then the quantize kernel. As ops of the graph,
the amax is a reduction inductor compiles with the rest: where x comes from an inductor kernel (a GELU, a
residual add, the backward of a norm), inductor can fuse the reduction into that kernel, which then writes x and
reduces it in one pass, and the quantize op reads x once (or, as it may choose, one kernel of two loops, the
reduction computing x again from the producer's inputs). Elsewhere (a weight, a tensor an opaque op made) it is
one reduction of inductor's, launched as inductor launches its kernels, instead of a zeroing and a Triton launch.

The ops work on the stored bits: ``max`` of ``bits & 0x7FF..`` over the finite values (bits below the format's
Inf), so the result is exactly the fp32 bits of max|x| over x's finite values as stored, whatever precision
inductor computes x's producer in before rounding it to x's dtype (a fused kernel keeps a bf16 value in fp32
until it stores it; a bitcast takes the stored value). The op receives the int32 bits, the quantize kernels'
amax cell. Only where the op's Triton quantizer would make its own amax pass: NVFP4 without the RHT (whose
amax is of the transformed tensor), a tensor of known, non-zero size (an amax of nothing is an error).
"""
from __future__ import annotations

import torch
from torch import fx

from autoprec.formats import NVFP4, get_format
from autoprec.kernels.dispatch.dense import quantize_dtype_problem, use_triton
from autoprec.passes.rewrite import add_like

aten = torch.ops.aten
prims = torch.ops.prims
autoprec_ops = torch.ops.autoprec  # registered by autoprec.kernels.ops
QUANTIZE, QUANTIZE_DUAL = autoprec_ops.quantize.default, autoprec_ops.quantize_dual.default

# per dtype of x: the integer dtype of its bits, the mask clearing the sign, the bits of +Inf (NaN's are above)
_BITS = {torch.float32: (torch.int32, 0x7FFFFFFF, 0x7F800000),
         torch.bfloat16: (torch.int16, 0x7FFF, 0x7F80),
         torch.float16: (torch.int16, 0x7FFF, 0x7C00)}


def graph_amaxes(gm: fx.GraphModule) -> int:
    """Give each NVFP4 quantize / quantize_dual node that takes no RHT, of a non-empty tensor of a dtype and on a
    device the Triton quantizers take, its tensor amax bits as graph ops (its ``amax`` argument); returns how many
    nodes now take one."""
    graph = gm.graph
    done = 0
    for q in [*graph.find_nodes(op="call_function", target=QUANTIZE),
              *graph.find_nodes(op="call_function", target=QUANTIZE_DUAL)]:
        if not _takes_graph_amax(q):
            continue
        with graph.inserting_before(q):
            q.args = (*q.args, amax_bits(graph, q.args[0], q))
        done += 1
    if done:
        graph.lint()
        gm.recompile()
    return done


def op_args(q: fx.Node) -> dict:
    """Quantize(_dual) node ``q``'s arguments by their names in the op's schema."""
    return dict(zip((arg.name for arg in q.target._schema.arguments), q.args))


def takes_rht(args: dict) -> bool:
    """Whether a quantize(_dual) node with arguments ``args`` (``op_args``) takes the RHT on a copy."""
    return any(args.get(name, False) for name in ("rht", "rht_a", "rht_b"))


def _takes_graph_amax(q: fx.Node) -> bool:
    """Whether quantize(_dual) node ``q`` quantizes to NVFP4 without the RHT a tensor whose amax the Triton
    quantizer would take in its own pass (and has no amax yet)."""
    args = op_args(q)
    x = args["x"].meta["val"]
    if get_format(args["fmt"]) is not NVFP4 or takes_rht(args) or "amax" in args:
        return False
    sized = isinstance(x.numel(), int) and x.numel() > 0  # a symbolic size may be 0 at run time
    return sized and quantize_dtype_problem(x.dtype) is None and use_triton(x.device, None)


def amax_bits(graph: fx.Graph, x: fx.Node, like: fx.Node) -> fx.Node:
    """Nodes computing the int32 holding the fp32 bits of max|x| over x's finite values (0 where none is), with
    ``like``'s meta."""
    dtype = x.meta["val"].dtype
    int_dtype, magnitude, inf = _BITS[dtype]
    bits = add_like(graph, aten.view.dtype, (x, int_dtype), like)
    bits = add_like(graph, aten.bitwise_and.Scalar, (bits, magnitude), like)
    finite = add_like(graph, aten.lt.Scalar, (bits, inf), like)
    bits = add_like(graph, aten.where.ScalarOther, (finite, bits, 0), like)
    top = add_like(graph, aten.amax.default, (bits,), like)
    if dtype == torch.float32:
        return top
    if dtype == torch.bfloat16:  # bf16's bits are fp32's top half
        top = add_like(graph, prims.convert_element_type.default, (top, torch.int32), like)
        return add_like(graph, aten.bitwise_left_shift.Tensor_Scalar, (top, 16), like)
    half = add_like(graph, aten.view.dtype, (top, torch.float16), like)  # fp16: converted, exactly
    wide = add_like(graph, prims.convert_element_type.default, (half, torch.float32), like)
    return add_like(graph, aten.view.dtype, (wide, torch.int32), like)
