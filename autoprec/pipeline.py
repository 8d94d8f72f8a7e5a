"""The pass order of one graph: analysis (normalize grouped ops, find matmuls, classify roles, group sites, key
GEMMs), then the planner's decisions, then the rewrite (quantize + scaled_mm ops, paired copies, graph amaxes).
A calibrating graph gets its forced GEMMs rewritten and the others tagged for measurement; a runtime graph gets
every GEMM rewritten as planned. The backend runs it inside AOTAutograd's partitioner and inference compiler.
See docs/planner.md.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import torch
import torch.fx as fx

from autoprec.model_root import module_name
from autoprec.passes.calibrate import TAG
from autoprec.passes.classify_roles import classify_roles
from autoprec.passes.find_matmuls import find_matmuls
from autoprec.passes.gemms import GraphGemm, graph_gemms
from autoprec.passes.graph_amax import graph_amaxes
from autoprec.passes.group_sites import Site, group_sites
from autoprec.passes.normalize_grouped import normalize_grouped
from autoprec.passes.pair_quantize import pair_quantizations
from autoprec.passes.rewrite import StepInput, rewrite_matmuls
from autoprec.passes.runner import PassError, PassRunner
from autoprec.passes.unplanned import find_unplanned, gathered_source
from autoprec.planner.calibration import GemmTag
from autoprec.planner.gemm_spec import key_seeds
from autoprec.planner.model_planner import ModelPlanner
from autoprec.planner.options import CompileOptions
from autoprec.planner.plan import Decision


@dataclass
class GraphPipeline:
    """The passes for one graph variant (one set of parameter objects) of a model: how its nodes are named in
    the model (``prefix``: the frame's path in the root; ``module_names``: module id -> root-relative name),
    its flat inputs and their parameter names, and its SR ``step_offset``."""

    planner: ModelPlanner
    opts: CompileOptions
    flat: list
    param_names: dict[int, list[str]]
    prefix: str | None
    module_names: dict[str, str]
    step_offset: int
    graph_id: int  # ties a calibrating graph's measurements together (``Calibration.end_run``)

    def _path(self, site: Site) -> str:
        return self._root_path(site.module_id, site.module_path)

    def _root_path(self, module_id: str | None, frame_path: str) -> str:
        """Root-relative module path: the frame's prefix + the frame-relative path, or (for a frame
        without parameters) the name of the module the node was traced in."""
        if self.prefix is not None:
            return module_name(self.prefix + frame_path)
        return self.module_names.get(module_id, module_name(frame_path)) if module_id else module_name(frame_path)

    def _gemms(self, gm: fx.GraphModule, num_fwd_outputs: int | None, runner: PassRunner) -> list[GraphGemm]:
        params = self._param_placeholders(gm)
        grads: set = set()
        if num_fwd_outputs is not None:
            outs = gm.graph.find_nodes(op="output")[0].args[0][num_fwd_outputs:]
            grads = {outs[i] for i, _ in params if i < len(outs) and isinstance(outs[i], fx.Node)}
        runner.run("normalize_grouped", normalize_grouped, gm, self._step(gm))
        matmuls = runner.run("find_matmuls", find_matmuls, gm.graph)
        infos = runner.run("classify_roles", classify_roles, gm.graph, matmuls, {n for _, n in params}, grads)
        sites = runner.run("group_sites", group_sites, infos)
        return runner.run("graph_gemms", graph_gemms, sites, self._path, self._param_ids(gm))

    def _decide(self, gm: fx.GraphModule, num_fwd_outputs: int | None, runner: PassRunner, label: str,
                stage: int | None):
        """(gemms, {key: Decision}) of a graph, or None when a pass broke an internal invariant: the graph
        then runs as traced and the plan says so. Analysis and assignment leave the graph untouched. ``stage``
        None: only the GEMMs the options force (a calibrating graph's)."""
        try:
            gemms = self._gemms(gm, num_fwd_outputs, runner)
            specs = [g.spec for g in gemms]
            if stage is None:
                return gemms, runner.run("assign_forced", self.planner.forced, specs)
            return gemms, runner.run("assign", self.planner.decide, specs, label, stage)
        except PassError as exc:
            self.planner.failures.append(str(exc))
            warnings.warn(f"{exc}; this graph runs as traced, without autoprec's formats", UserWarning, stacklevel=2)
            return None

    def _rewrite(self, gm: fx.GraphModule, num_fwd_outputs: int | None, gemms: list[GraphGemm],
                 decisions: dict, runner: PassRunner, label: str) -> None:
        """Rewrite the decided GEMMs; one whose shape in this graph cannot take its plan's blocks (a K
        that differs between graphs) runs in BF16 here, and the plan's row says so."""
        by_node: dict[fx.Node, Decision] = {}
        for g in gemms:
            d = decisions.get(g.spec.key)
            if d is None:
                continue
            problem = g.spec.blocking.get(d.fmt)
            if problem:
                self.planner.deviate(g.spec.key, f"in {label}: {problem}, BF16")
                d = replace(d, fmt="bf16", rounding="rne", rht=False, tile2d=False)
            by_node[g.info.mm.node] = d
        infos = {g.info.mm.node: g.info for g in gemms}
        weight_key = f"{id(self.planner)}" if self.opts.rl and num_fwd_outputs is None else None
        runner.run("rewrite_matmuls", rewrite_matmuls, gm, by_node, infos, self.opts,
                   StepInput(self._step(gm), self.step_offset), weight_key)
        runner.run("pair_quantizations", pair_quantizations, gm)
        if self.opts.inner == "inductor":  # a reduction inductor may fuse into x's producer; eagerly, several kernels
            runner.run("graph_amaxes", graph_amaxes, gm)
        for name, seconds in runner.timings.items():
            self.planner.pass_seconds[name] = self.planner.pass_seconds.get(name, 0.0) + seconds

    def _step(self, gm: fx.GraphModule) -> fx.Node:
        """The step input: the last of the non-tangent placeholders (it is the last user input)."""
        return [n for n in gm.graph.find_nodes(op="placeholder") if "tangents" not in n.name][-1]

    def tag(self, gm: fx.GraphModule, num_fwd_outputs: int | None, label: str) -> None:
        """Calibration graph: forced GEMMs are rewritten already (so e.g. rl_trainer's forward matches
        its sampler from the first step); every other GEMM is tagged for measurement."""
        runner = PassRunner()
        decided = self._decide(gm, num_fwd_outputs, runner, label, None)
        if decided is None:
            return
        gemms, forced = decided
        for g in gemms:
            if not g.spec.sdpa and g.spec.key not in forced:
                g.info.mm.node.meta[TAG] = GemmTag(g.spec.key, (self.graph_id, g.pair),
                                                   g.info.grad_operand, g.info.weight_operand,
                                                   key_seeds(self.opts.seed, g.spec.key), g.info.mm.layout)
        self._rewrite(gm, num_fwd_outputs, gemms, forced, runner, label)

    def plan_and_rewrite(self, gm: fx.GraphModule, num_fwd_outputs: int | None, label: str, stage: int) -> None:
        """Runtime graph: every GEMM looked up in (or decided for) the plan in schedule stage ``stage``, rewritten."""
        runner = PassRunner()
        decided = self._decide(gm, num_fwd_outputs, runner, label, stage)
        if decided is None:
            return
        gemms, decisions = decided
        for g in gemms:
            self.planner.weight_names.update(self.param_names.get(g.spec.weight_id, ()))
        ids = self._param_ids(gm)
        for g in gemms:
            for operand in (g.info.mm.a, g.info.mm.b):
                src = gathered_source(operand)
                if src in ids:
                    self.planner.gathered_names.update(self.param_names.get(ids[src], ()))
        for op in runner.run("find_unplanned", find_unplanned, gm.graph, set(ids)):
            names = [n for p in op.params for n in self.param_names.get(ids[p], ())]
            path = self._root_path(op.module_id, op.module_path)
            self.planner.note_unplanned(label, path, op.op, op.flops, names)
        self._rewrite(gm, num_fwd_outputs, gemms, decisions, runner, label)

    def _param_ids(self, gm: fx.GraphModule) -> dict[fx.Node, int]:
        """Parameter placeholders of ``gm`` -> ids of this variant's real parameters."""
        return {n: id(self.flat[i]) for i, n in self._param_placeholders(gm)}

    def _param_placeholders(self, gm: fx.GraphModule) -> list[tuple[int, fx.Node]]:
        phs = [n for n in gm.graph.find_nodes(op="placeholder") if "tangents" not in n.name]
        flat = self.flat
        return [(i, n) for i, n in enumerate(phs) if i < len(flat) and isinstance(flat[i], torch.nn.Parameter)]
