"""The ``autoprec`` torch.compile backend.

Dynamo hands over an FX graph and real example inputs. AOTAutograd traces the joint forward+backward
graph; our partition_fn sees it whole, runs the analysis and rewrite passes (so every GEMM is planned
with its role known), then min-cut partitions it. Inference graphs (no_grad, eval) go through the
same passes in the inference compiler. With recipe ``auto`` the first ``calibrate`` calls run the
graphs through a measuring fx Interpreter (GEMMs fixed by overrides already rewritten); the next call
plans and rewrites once. One compiled graph can serve several module instances after a
graph break (identical blocks): the backend keeps one compiled variant per set of parameter objects,
so each plan belongs to the parameters it was made for.
"""
from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition

from autoprec.kernels.ops import set_sr_step
from autoprec.options import CompileOptions, parse_options
from autoprec.passes.assign import assign, assign_forced, gemms_of
from autoprec.passes.calibrate import TAG, CalibratingInterpreter, Calibration, GemmTag
from autoprec.passes.classify_roles import classify_roles
from autoprec.passes.find_matmuls import find_matmuls
from autoprec.passes.group_sites import group_sites
from autoprec.passes.rewrite import rewrite_matmuls
from autoprec.passes.runner import PassError, PassRunner
from autoprec.passes.saved_bytes import saved_tensor_bytes
from autoprec.plan import Decision


@dataclass
class GraphRecord:
    """What one compiled variant decided: its decisions, the modules and parameters they refer to."""

    kind: str
    decisions: list[Decision] = field(default_factory=list)
    module_ids: list[str | None] = field(default_factory=list)
    stack_ids: list[tuple[str, ...]] = field(default_factory=list)  # ids of each GEMM's enclosing modules
    weight_ids: list[int | None] = field(default_factory=list)
    param_ids: set[int] = field(default_factory=set)
    saved_bytes: int | None = None
    hardware: str = "gb300"
    owner: Callable[[], object] | None = None  # weakref to the compiled variant: gone after a dynamo reset
    timings: dict[str, float] = field(default_factory=dict)
    failure: str | None = None  # a pass that failed: the graph ran as traced

    @property
    def alive(self) -> bool:
        return self.owner is None or self.owner() is not None


RECORDS: list[GraphRecord] = []


def planned_module_ids() -> set[str]:
    """Ids of the modules (and their ancestors) whose GEMMs a live compiled graph has planned."""
    return {mid for r in RECORDS if r.alive for stack in r.stack_ids for mid in stack}


def planned_weight_ids() -> set[int]:
    """Ids of the parameters whose GEMMs a live compiled graph has planned."""
    return {w for r in RECORDS if r.alive for w in r.weight_ids if w is not None}


def _flat_args(gm: fx.GraphModule, args: list) -> list:
    """The flat inputs AOTAutograd traces: the graph module's own parameters and buffers, then args."""
    own = {**dict(gm.named_parameters(remove_duplicate=False)), **dict(gm.named_buffers(remove_duplicate=False))}
    return list(own.values()) + list(args)


class _Variant:
    """One set of parameter objects: calibrates first (recipe ``auto``), then compiles the rewrite."""

    def __init__(self, owner: "CompiledGraph", args: list) -> None:
        self.owner, self.gm, self.opts = owner, owner.gm, owner.opts
        self.flat = _flat_args(self.gm, args)
        self.record = GraphRecord("training", hardware=self.opts.hardware)
        self.record.param_ids = {id(t) for t in self.flat if isinstance(t, torch.nn.Parameter)}
        self.record.owner = weakref.ref(self)
        RECORDS.append(self.record)
        needs = self.opts.recipe == "auto" and self.opts.plan is None
        self.calibration = Calibration(self.opts.mx_scale) if needs else None
        self.calibrating_fn: Callable | None = None
        self.fn: Callable | None = None
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        set_sr_step(self.calls)  # per parameter set: a run's SR bits do not depend on other models
        if self.calibration is not None and self.calibration.steps < self.opts.calibrate:
            if self.calibrating_fn is None:
                self.calibrating_fn = self._aot(self._partition_calibrate, self._interpreter,
                                                self._inference_calibrate)
            return self.calibrating_fn(*args)
        if self.fn is None:
            inner = self._inner_compiler()
            self.fn = self._aot(self._partition, inner, self._inference)
        return self.fn(*args)

    def _aot(self, partition: Callable, compiler: Callable, inference: Callable) -> Callable:
        """AOTAutograd on dynamo's fake example inputs, inside dynamo's tracing context, so symbolic
        sizes stay symbolic even when this runs at a later call."""
        bw = (lambda g, ex: compiler(g, ex, last=True)) if compiler == self._interpreter else compiler
        with torch._guards.tracing(self.owner.tracing_context):
            return aot_module_simplified(self.gm, self.owner.example_inputs, fw_compiler=compiler, bw_compiler=bw,
                                         partition_fn=partition, inference_compiler=inference,
                                         decompositions=self._decompositions())

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

    def _interpreter(self, gm: fx.GraphModule, example_inputs, last: bool = False) -> Callable:
        """Runs ``gm`` unchanged while measuring its GEMMs; ``last`` closes a calibration step."""
        calibration = self.calibration
        return make_boxed_func(lambda *a: CalibratingInterpreter(gm, calibration, last).run(*a))

    def _analyze(self, gm: fx.GraphModule, params: set[fx.Node], param_grads: set[fx.Node], runner: PassRunner):
        matmuls = runner.run("find_matmuls", find_matmuls, gm.graph)
        infos = runner.run("classify_roles", classify_roles, gm.graph, matmuls, params, param_grads)
        return infos, runner.run("group_sites", group_sites, infos)

    def _roles_inputs(self, gm: fx.GraphModule, num_fwd_outputs: int | None) -> tuple[set, set]:
        params = self._param_placeholders(gm)
        if num_fwd_outputs is None:
            return {n for _, n in params}, set()
        grads = gm.graph.find_nodes(op="output")[0].args[0][num_fwd_outputs:]
        param_grads = {grads[i] for i, _ in params if i < len(grads) and isinstance(grads[i], fx.Node)}
        return {n for _, n in params}, param_grads

    def _decide(self, gm: fx.GraphModule, num_fwd_outputs: int | None, runner: PassRunner, only_forced: bool):
        """Analysis and assignment, which leave the graph untouched: (infos, sites, decisions), or None when
        a pass broke an internal invariant; the graph then runs as traced and the plan says so."""
        try:
            infos, sites = self._analyze(gm, *self._roles_inputs(gm, num_fwd_outputs), runner)
            if only_forced:
                decisions = runner.run("assign_forced", assign_forced, sites, self.opts, self._weight_ids(gm))
            else:
                decisions = runner.run("assign", assign, sites, self.opts, self.calibration, self._weight_ids(gm))
        except PassError as exc:
            self.record.failure = str(exc)
            warnings.warn(f"{exc}; this graph runs as traced, without autoprec's formats", UserWarning, stacklevel=2)
            return None
        return infos, sites, decisions

    def _tag(self, gm: fx.GraphModule, num_fwd_outputs: int | None) -> None:
        """Calibration graph: forced GEMMs are rewritten already (so e.g. rl_trainer's forward matches
        its sampler from the first step); every other GEMM is tagged for measurement."""
        runner = PassRunner()
        decided = self._decide(gm, num_fwd_outputs, runner, only_forced=True)
        if decided is None:
            return
        infos, sites, forced = decided
        for g in gemms_of(sites, self.opts.seed):
            if not g.site.sdpa and g.info.mm.node not in forced:
                g.info.mm.node.meta[TAG] = GemmTag(g.key, g.info.grad_operand, g.info.weight_operand, g.seeds)
        by_node = {info.mm.node: info for info in infos}
        runner.run("rewrite_matmuls", rewrite_matmuls, gm, forced, by_node, self.opts)

    def _plan_and_rewrite(self, gm: fx.GraphModule, num_fwd_outputs: int | None) -> None:
        runner = PassRunner()
        decided = self._decide(gm, num_fwd_outputs, runner, only_forced=False)
        if decided is None:
            return
        infos, sites, decisions = decided
        by_node = {info.mm.node: info for info in infos}
        runner.run("rewrite_matmuls", rewrite_matmuls, gm, decisions, by_node, self.opts)
        placeholders = {n: i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
        for site in sites:
            weight_id = id(self.flat[placeholders[site.weight]]) if site.weight in placeholders else None
            for info in site.gemms:
                self.record.decisions.append(decisions[info.mm.node])
                self.record.module_ids.append(site.module_id)
                self.record.stack_ids.append(site.stack_ids)
                self.record.weight_ids.append(weight_id)
        self.record.timings = runner.timings

    def _weight_ids(self, gm: fx.GraphModule) -> dict[fx.Node, int]:
        """Parameter placeholders of ``gm`` -> ids of this variant's real parameters."""
        return {n: id(self.flat[i]) for i, n in self._param_placeholders(gm)}

    def _param_placeholders(self, gm: fx.GraphModule) -> list[tuple[int, fx.Node]]:
        phs = [n for n in gm.graph.find_nodes(op="placeholder") if "tangents" not in n.name]
        flat = self.flat
        return [(i, n) for i, n in enumerate(phs) if i < len(flat) and isinstance(flat[i], torch.nn.Parameter)]

    def _partition_calibrate(self, joint: fx.GraphModule, joint_inputs, *, num_fwd_outputs: int, **kwargs):
        self._tag(joint, num_fwd_outputs)
        return min_cut_rematerialization_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)

    def _inference_calibrate(self, gm: fx.GraphModule, example_inputs):
        self._tag(gm, None)
        return self._interpreter(gm, example_inputs, last=True)

    def _partition(self, joint: fx.GraphModule, joint_inputs, *, num_fwd_outputs: int, **kwargs):
        self._plan_and_rewrite(joint, num_fwd_outputs)
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
        self.record.saved_bytes = saved_tensor_bytes(fw, num_fwd_outputs)
        return fw, bw

    def _inference(self, gm: fx.GraphModule, example_inputs):
        self.record.kind = "inference"
        self._plan_and_rewrite(gm, None)
        return self._inner_compiler()(gm, example_inputs)


class CompiledGraph:
    """The callable handed back to dynamo: one compiled variant per set of parameter objects."""

    def __init__(self, gm: fx.GraphModule, opts: CompileOptions, example_inputs: list) -> None:
        self.gm, self.opts = gm, opts
        self.tracing_context = torch._guards.TracingContext.try_get()
        fakes = [n.meta.get("example_value") for n in gm.graph.find_nodes(op="placeholder")]
        self.example_inputs = fakes if all(f is not None for f in fakes) else list(example_inputs)
        self.variants: dict[tuple[int, ...], _Variant] = {}

    def _variant(self, args: list) -> _Variant:
        key = tuple(id(a) for a in args if isinstance(a, torch.nn.Parameter))
        if key not in self.variants:
            self.variants[key] = _Variant(self, args)
        return self.variants[key]

    def __call__(self, *args):
        return self._variant(list(args))(*args)


def autoprec_backend(gm: fx.GraphModule, example_inputs: list, options: dict | None = None) -> Callable:
    """torch.compile backend entry point (``backend="autoprec"``)."""
    return CompiledGraph(gm, parse_options(options), example_inputs)
