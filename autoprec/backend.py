"""The ``autoprec`` torch.compile backend.

Dynamo hands over an FX graph and real example inputs. AOTAutograd traces the joint forward+backward
graph; our partition_fn sees it whole, runs the analysis and rewrite passes (so every GEMM is planned
with its role known), then min-cut partitions it. Inference graphs (no_grad, eval) go through the same
passes in the inference compiler. One compiled graph can serve several module instances after a
graph break (identical blocks): the backend keeps one compiled variant per set of parameter objects,
so each plan belongs to the parameters it was made for.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition

from autoprec.options import CompileOptions, parse_options
from autoprec.passes.assign_recipe import assign_recipe
from autoprec.passes.classify_roles import classify_roles
from autoprec.passes.find_matmuls import find_matmuls
from autoprec.passes.group_sites import group_sites
from autoprec.passes.rewrite import rewrite_matmuls
from autoprec.passes.runner import PassRunner
from autoprec.passes.saved_bytes import saved_tensor_bytes
from autoprec.plan import Decision


@dataclass
class GraphRecord:
    """What one compiled variant decided: its decisions, the modules and parameters they refer to."""

    kind: str
    decisions: list[Decision] = field(default_factory=list)
    module_ids: list[str | None] = field(default_factory=list)
    module_types: list[str] = field(default_factory=list)
    weight_ids: list[int | None] = field(default_factory=list)
    param_ids: set[int] = field(default_factory=set)
    saved_bytes: int | None = None
    rewritten: int = 0
    timings: dict[str, float] = field(default_factory=dict)


RECORDS: list[GraphRecord] = []


def _flat_args(gm: fx.GraphModule, args: list) -> list:
    """The flat inputs AOTAutograd traces: the graph module's own parameters and buffers, then args."""
    own = {**dict(gm.named_parameters(remove_duplicate=False)), **dict(gm.named_buffers(remove_duplicate=False))}
    return list(own.values()) + list(args)


class _Variant:
    """Compiles the dynamo graph for one set of parameter objects and records its plan."""

    def __init__(self, gm: fx.GraphModule, opts: CompileOptions, args: list) -> None:
        self.opts = opts
        self.flat = _flat_args(gm, args)
        self.record = GraphRecord("training")
        self.record.param_ids = {id(t) for t in self.flat if isinstance(t, torch.nn.Parameter)}
        RECORDS.append(self.record)
        inner = self._inner_compiler()
        self.fn = aot_module_simplified(
            gm, list(args), fw_compiler=inner, bw_compiler=inner, partition_fn=self._partition,
            inference_compiler=self._inference, decompositions=self._decompositions(),
        )

    def _decompositions(self) -> dict | None:
        if self.opts.inner != "inductor":
            return None
        from torch._inductor.decomposition import select_decomp_table

        return select_decomp_table()

    def _inner_compiler(self) -> Callable:
        if self.opts.inner == "inductor":
            from torch._inductor.compile_fx import compile_fx_inner

            return compile_fx_inner
        return lambda g, example_inputs: make_boxed_func(g)

    def _plan_and_rewrite(self, gm: fx.GraphModule, params: set[fx.Node], param_grads: set[fx.Node]) -> None:
        runner = PassRunner()
        matmuls = runner.run("find_matmuls", find_matmuls, gm.graph)
        infos = runner.run("classify_roles", classify_roles, gm.graph, matmuls, params, param_grads)
        sites = runner.run("group_sites", group_sites, infos)
        decisions = runner.run("assign_recipe", assign_recipe, sites, self.opts)
        by_node = {info.mm.node: info for info in infos}
        self.record.rewritten = runner.run("rewrite_matmuls", rewrite_matmuls, gm, decisions, by_node, self.opts)
        placeholders = {n: i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
        for site in sites:
            weight_id = id(self.flat[placeholders[site.weight]]) if site.weight in placeholders else None
            for info in site.gemms:
                self.record.decisions.append(decisions[info.mm.node])
                self.record.module_ids.append(site.module_id)
                self.record.module_types.append(site.module_type)
                self.record.weight_ids.append(weight_id)
        self.record.timings = runner.timings

    def _param_placeholders(self, gm: fx.GraphModule) -> list[tuple[int, fx.Node]]:
        phs = [n for n in gm.graph.find_nodes(op="placeholder") if "tangents" not in n.name]
        flat = self.flat
        return [(i, n) for i, n in enumerate(phs) if i < len(flat) and isinstance(flat[i], torch.nn.Parameter)]

    def _partition(self, joint: fx.GraphModule, joint_inputs, *, num_fwd_outputs: int, **kwargs):
        outputs = joint.graph.find_nodes(op="output")[0].args[0]
        grads = outputs[num_fwd_outputs:]
        params = self._param_placeholders(joint)
        param_grads = {grads[i] for i, _ in params if i < len(grads) and isinstance(grads[i], fx.Node)}
        self._plan_and_rewrite(joint, {n for _, n in params}, param_grads)
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
        self.record.saved_bytes = saved_tensor_bytes(fw, num_fwd_outputs)
        return fw, bw

    def _inference(self, gm: fx.GraphModule, example_inputs):
        self.record.kind = "inference"
        self._plan_and_rewrite(gm, {n for _, n in self._param_placeholders(gm)}, set())
        return self._inner_compiler()(gm, example_inputs)


class CompiledGraph:
    """The callable handed back to dynamo: one compiled variant per set of parameter objects."""

    def __init__(self, gm: fx.GraphModule, opts: CompileOptions, example_inputs: list) -> None:
        self.gm, self.opts = gm, opts
        self.variants: dict[tuple[int, ...], _Variant] = {}
        self._variant(list(example_inputs))

    def _variant(self, args: list) -> _Variant:
        key = tuple(id(a) for a in args if isinstance(a, torch.nn.Parameter))
        if key not in self.variants:
            self.variants[key] = _Variant(self.gm, self.opts, args)
        return self.variants[key]

    def __call__(self, *args):
        return self._variant(list(args)).fn(*args)


def autoprec_backend(gm: fx.GraphModule, example_inputs: list, options: dict | None = None) -> Callable:
    """torch.compile backend entry point (``backend="autoprec"``)."""
    return CompiledGraph(gm, parse_options(options), example_inputs)
