"""Rewrite pass: each planned mm / addmm / bmm becomes autoprec quantize ops feeding one scaled_mm; each
planned grouped (experts) GEMM becomes one autoprec grouped_mm, which quantizes each group on its own
(``grouped_mm_on_device``, the op without the CUDA-graph tag, where it reads nothing on the host). A weight
in square tiles (NVFP4 16x16, FP8-block 128x128) is quantized once: its dgrad reads the transpose of its fprop's
quantization."""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode

import autoprec.kernels.ops  # noqa: F401  (registers torch.ops.autoprec)
from autoprec.formats import get_format
from autoprec.kernels.core.random_bits import offset_seed
from autoprec.kernels.dispatch.grouped_mm import group_count
from autoprec.kernels.dispatch.grouped_route import grouped_route
from autoprec.passes.classify_roles import RoleInfo
from autoprec.passes.runner import at_node
from autoprec.planner.candidates import grouped_config, operand_spec
from autoprec.planner.options import CompileOptions
from autoprec.planner.plan import Decision
from autoprec.roles import MatmulRole

aten = torch.ops.aten
prims = torch.ops.prims
autoprec_ops = torch.ops.autoprec


@dataclass(frozen=True)
class StepInput:
    """The graph input carrying the model's call counter (stochastic rounding's step) XOR ``offset``, the
    ``path_key`` of the module the graph was traced in (0 for the model's own graph): the quantize ops hold the
    seeds offset by it, so a graph run by several identical blocks holds the same seeds in each."""

    node: fx.Node
    offset: int = 0

    def seed(self, seed: int, rounding: str) -> int:
        """The op's seed argument for an operand of plan seed ``seed`` (0 without SR: RNE draws no bits)."""
        return offset_seed(seed, self.offset) if rounding == "sr" else 0


def _add(graph: fx.Graph, target, args: tuple, kwargs: dict, meta: dict, val, tag: dict) -> fx.Node:
    node = graph.call_function(target, args, kwargs)
    node.meta.update({k: v for k, v in meta.items() if k not in ("val", "tensor_meta", "partitioner_tag")})
    node.meta["val"] = val
    node.meta["autoprec"] = tag
    return node


def _operand(graph: fx.Graph, x: fx.Node, which: int, d: Decision, info: RoleInfo, opts: CompileOptions,
             meta: dict, tag: dict, step: StepInput) -> list[fx.Node]:
    """Nodes for operand ``which`` (0 = a, blocked along its last dim; 1 = b, along dim -2): the (codes, scales,
    tensor_scale; MXFP8's scales again) of its quantization, or its bf16 values stored (rows, K). Only ops that
    survive inductor's decompositions (permute, prims.convert_element_type) are inserted."""
    val = x.meta["val"]
    fake = detect_fake_mode([val])
    tag = {**tag, "operand": "ab"[which]}
    if not get_format(d.fmt).quantized:
        if which == 1:
            dims = list(range(val.ndim - 2)) + [val.ndim - 1, val.ndim - 2]
            with fake:
                tval = val.permute(dims)
            x = _add(graph, aten.permute.default, (x, dims), {}, meta, tval, tag)
            val = tval
        with fake:
            cval = val.to(torch.bfloat16)
        cast = _add(graph, prims.convert_element_type.default, (x, torch.bfloat16), {}, meta, cval, tag)
        return [cast, cast, cast]
    spec = operand_spec(d, which, val.ndim, info.grad_operand, info.weight_operand, opts.mx_scale)
    args = (x, spec.fmt, spec.axis, spec.rounding.value, step.seed(d.seeds[which], spec.rounding), spec.tile2d,
            spec.scale_rule.value, spec.rht, opts.seed, step.node)
    amax = _static_amax(graph, d, which, val.device, meta, tag)
    args = args if amax is None else (*args, amax)
    with fake:
        vals = autoprec_ops.quantize.default(val, *[a.meta["val"] if isinstance(a, fx.Node) else a for a in args[1:]])
    q = _add(graph, autoprec_ops.quantize.default, args, {}, meta, vals, tag)
    # MXFP8 has no tensor scale: the op's third part (empty) is left unread and the matmul's slot for it carries the
    # scales (unread there too), so no graph holds, saves or partitions an empty tensor
    scaled = bool(get_format(d.fmt).tensor_scale_bits)
    parts = [_add(graph, operator.getitem, (q, i), {}, meta, vals[i], tag) for i in range(3 if scaled else 2)]
    return parts if scaled else [*parts, parts[1]]


def _static_amax(graph: fx.Graph, d: Decision, which: int, device: torch.device, meta: dict, tag: dict
                 ) -> fx.Node | None:
    """A node holding operand ``which``'s static NVFP4 tensor amax (the int32 of its fp32 bits, made on the
    operand's device) where the decision fixes one, else None."""
    amax = d.input_amax[which] if d.input_amax is not None and get_format(d.fmt).tensor_scale_bits else None
    if amax is None:
        return None
    value = torch.tensor(amax, dtype=torch.float32).view(torch.int32).item()
    args = ([], value)
    kwargs = {"dtype": torch.int32, "device": device}
    with detect_fake_mode([v for v in (meta.get("val"),) if isinstance(v, torch.Tensor)]):
        val = aten.full.default(*args, **kwargs)
    return _add(graph, aten.full.default, args, kwargs, meta, val, {**tag, "operand": "ab"[which]})


def _grouped(graph: fx.Graph, node: fx.Node, info: RoleInfo, d: Decision, opts: CompileOptions, step: StepInput,
             current, tag: dict) -> fx.Node:
    """One ``autoprec.grouped_mm`` node running a grouped (experts) GEMM in the decision's format; the op without
    the CUDA-graph tag, ``grouped_mm_on_device``, where it reads nothing on the host on the graph's device
    (``grouped_route``'s ``host_read``)."""
    mm = info.mm
    cfg = grouped_config(d, info.grad_operand, info.weight_operand)
    fmt = d.fmt if get_format(d.fmt).quantized else "bf16"
    out_dtype = node.meta["val"].dtype
    seeds = [step.seed(seed, cfg[f"rounding_{ab}"]) for seed, ab in zip(d.seeds, "ab")]
    args = (current(mm.a), current(mm.b), current(mm.offs), fmt, cfg["rounding_a"], cfg["rounding_b"], cfg["tile2d_b"],
            cfg["rht"], *seeds, opts.mx_scale, opts.seed, step.node, out_dtype)
    a, b = mm.a.meta["val"], mm.b.meta["val"]
    amax = _static_amax(graph, d, 0, a.device, node.meta, tag)
    args = args if amax is None else (*args, amax)
    groups = group_count(a.shape, None if mm.offs is None else mm.offs.meta["val"].shape, mm.layout)
    route = grouped_route(a.device, mm.layout, fmt, (a.dtype, b.dtype), (a.shape, b.shape), groups, cfg["tile2d_b"],
                          out_dtype)
    op = autoprec_ops.grouped_mm if route.host_read else autoprec_ops.grouped_mm_on_device
    return add_like(graph, op.default, args, node, tag)


def add_like(graph: fx.Graph, op, args: tuple, like: fx.Node, tag: dict | None = None) -> fx.Node:
    """A node computing ``op(*args)`` in place of node ``like``: like's meta (module stack, seq_nr,
    partitioner tag), the fake value of ``op`` on the arguments' fake values, and the autoprec ``tag``."""
    fake_args = [x.meta["val"] if isinstance(x, fx.Node) else x for x in args]
    with detect_fake_mode([v for v in fake_args if isinstance(v, torch.Tensor)]):
        val = op(*fake_args)
    node = graph.call_function(op, args)
    node.meta.update({k: v for k, v in like.meta.items() if k not in ("val", "tensor_meta")})
    node.meta["val"] = val
    if tag is not None:
        node.meta["autoprec"] = tag
    return node


def _shared_weight(graph: fx.Graph, info: RoleInfo, d: Decision, shared: dict, meta: dict, tag: dict
                   ) -> list[fx.Node] | None:
    """A dgrad's square-tiled weight operand as the transpose of its fprop's quantization (the same
    tiles, scales and codes: the weight is quantized once per step); None where there is none to share."""
    key = _weight_key(info, d)
    if info.role is not MatmulRole.DGRAD or key not in shared:
        return None
    (codes, scales, ts), fprop_shape = shared[key]
    if tuple(info.mm.b.meta["val"].shape) != tuple(reversed(fprop_shape)):  # read through another view
        return None
    tag = {**tag, "operand": "b"}
    with detect_fake_mode([codes.meta["val"]]):
        vals = autoprec_ops.transpose_tiles.default(codes.meta["val"], scales.meta["val"], d.fmt)
    node = _add(graph, autoprec_ops.transpose_tiles.default, (codes, scales, d.fmt), {}, meta, vals, tag)
    return [_add(graph, operator.getitem, (node, i), {}, meta, vals[i], tag) for i in range(2)] + [ts]


def _weight_key(info: RoleInfo, d: Decision) -> tuple | None:
    """What makes two GEMMs' square-tiled weight quantizations the same: weight, format, dtype."""
    if info.weight_operand != 1 or info.weight_placeholder is None or d.rht:
        return None
    if not operand_spec(d, 1, info.mm.b.meta["val"].ndim, info.grad_operand, info.weight_operand).tile2d:
        return None
    return info.weight_placeholder, d.fmt, info.mm.b.meta["val"].dtype


def _cached_weight(graph: fx.Graph, node: fx.Node, info: RoleInfo, d: Decision, opts: CompileOptions, a: list,
                   b: fx.Node, bias: fx.Node | None, key: str, tag: dict) -> fx.Node:
    """One ``autoprec.scaled_mm_weight`` node: the product with weight ``b`` prepared once per weight version."""
    b_tiled = operand_spec(d, 1, 2, info.grad_operand, info.weight_operand).tile2d
    args = (*a, d.fmt, b, d.fmt, b_tiled, opts.mx_scale, f"{key}|{d.module}|{d.role}|{d.index}", bias,
            node.meta["val"].dtype)
    return add_like(graph, autoprec_ops.scaled_mm_weight.default, args, node, tag)


def _caches_weight(info: RoleInfo) -> bool:
    """A forward product of 2D activations with a 2D parameter as B: the form ``scaled_mm_weight`` takes."""
    return (info.role is MatmulRole.FPROP and info.weight_operand == 1 and info.weight_placeholder is not None
            and info.mm.a.meta["val"].ndim == 2 and info.mm.b.meta["val"].ndim == 2)


def rewrite_matmuls(
    gm: fx.GraphModule, decisions: dict[fx.Node, Decision], infos: dict[fx.Node, RoleInfo], opts: CompileOptions,
    step: StepInput, weight_key: str | None = None,
) -> int:
    """Replace every rewritten decision's node; returns how many were replaced. ``step``: the graph input
    carrying the model's call counter (stochastic rounding's step), and the offset the ops' seeds take.
    ``weight_key`` (an inference graph of an RL phase): its forward products with a parameter keep their weight
    prepared across calls under this key (``kernels/weight_cache.py``)."""
    graph = gm.graph
    count = 0
    replaced: dict[fx.Node, fx.Node] = {}  # a GEMM's output feeding another GEMM: use the rewritten node

    def current(x: fx.Node | None) -> fx.Node | None:
        return replaced.get(x, x)

    shared: dict[tuple, tuple] = {}  # square-tiled weights quantized by an fprop (parts, b's shape), for dgrads
    fprop_first = sorted(decisions.items(), key=lambda item: infos[item[0]].role is not MatmulRole.FPROP)
    for node, d in fprop_first:
        if not d.rewritten:
            continue
        with at_node(node):
            info = infos[node]
            tag = {"site": d.site, "role": str(d.role), "format": d.fmt}
            with graph.inserting_before(node):
                if info.mm.layout is not None:
                    out = _grouped(graph, node, info, d, opts, step, current, tag)
                elif weight_key is not None and _caches_weight(info):
                    a = _operand(graph, current(info.mm.a), 0, d, info, opts, node.meta, tag, step)
                    out = _cached_weight(graph, node, info, d, opts, a, current(info.mm.b), current(info.mm.bias),
                                         weight_key, tag)
                else:
                    a = _operand(graph, current(info.mm.a), 0, d, info, opts, node.meta, tag, step)
                    b = _shared_weight(graph, info, d, shared, node.meta, tag)
                    if b is None:
                        b = _operand(graph, current(info.mm.b), 1, d, info, opts, node.meta, tag, step)
                        key = _weight_key(info, d)
                        if info.role is MatmulRole.FPROP and key is not None:
                            shared.setdefault(key, (b, tuple(info.mm.b.meta["val"].shape)))
                    b_ndim = info.mm.b.meta["val"].ndim
                    b_tiled = operand_spec(d, 1, b_ndim, info.grad_operand, info.weight_operand).tile2d
                    tile_rows = get_format(d.fmt).tile if b_tiled else 1
                    args = (*a, d.fmt, *b, d.fmt, tile_rows, current(info.mm.bias), node.meta["val"].dtype)
                    out = add_like(graph, autoprec_ops.scaled_mm.default, args, node, tag)
            node.replace_all_uses_with(out)
            graph.erase_node(node)
            replaced[node] = out
            count += 1
    graph.lint()
    gm.recompile()
    return count
