"""The ``autoprec`` torch.compile backend.

Dynamo hands over an FX graph and real example inputs. AOTAutograd traces the joint forward+backward
graph; our partition_fn sees it whole, runs the analysis passes (so every GEMM is known with its role),
looks each GEMM up in the model's plan (``ModelPlan``: one decision per root-relative module path, role
and ordinal, shared by every graph of the model), rewrites it, then min-cut partitions. Inference graphs
(no_grad, eval) go through the same passes in the inference compiler. With recipe ``auto`` the graphs
first run through a measuring fx Interpreter; once one graph has finished ``calibrate`` runs, the plan
is fixed for the whole model from the measurements of all its graphs (and ranks).

Every graph gets one extra input: the model's call counter, which seeds stochastic rounding; backward
quantizations read the value of their own forward call, so micro-batches draw fresh bits. One compiled
graph can serve several module instances (identical blocks after a graph break, or each block compiled on
its own): the backend keeps one variant per set of parameter objects and names each variant's GEMMs by the
modules it really runs. The step input carries the variant's module ``path_key`` XOR the counter, so blocks
with the same decisions rewrite to the same graph (their seeds offset by it alike), and the inner compiler
(inductor's, the costly part) runs once for all of them (``inner_compiles.py``), even where each block
has a dynamo graph of its own.
"""
from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.fx as fx
from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor

from autoprec.cache_key import keyed_by_autoprec
from autoprec.cost import device_note
from autoprec.inner_compiles import compile_once
from autoprec.model_plan import ModelPlan, plan_for
from autoprec.model_root import find_root, frame_prefix, module_name, named_modules, named_parameters
from autoprec.options import CompileOptions, parse_options
from autoprec.passes.calibrate import TAG, CalibratingInterpreter, GemmTag
from autoprec.passes.classify_roles import classify_roles
from autoprec.passes.find_matmuls import find_matmuls
from autoprec.passes.gemms import GraphGemm, graph_gemms, key_seeds, path_key
from autoprec.passes.graph_amax import graph_amaxes
from autoprec.passes.group_sites import Site, group_sites
from autoprec.passes.normalize_grouped import normalize_grouped
from autoprec.passes.pair_quantize import pair_quantizations
from autoprec.passes.rewrite import StepInput, rewrite_matmuls
from autoprec.passes.runner import PassError, PassRunner
from autoprec.passes.saved_bytes import saved_tensor_bytes
from autoprec.passes.unplanned import find_unplanned, gathered_source
from autoprec.plan import Decision

STEP_INPUT = "autoprec_step"


def _flat_args(gm: fx.GraphModule, args: list) -> list:
    """The flat inputs AOTAutograd traces: the graph module's own parameters and buffers, then args."""
    own = {**dict(gm.named_parameters(remove_duplicate=False)), **dict(gm.named_buffers(remove_duplicate=False))}
    return list(own.values()) + list(args)


class _Variant:
    """One set of parameter objects: calibrates first (recipe ``auto``), then compiles the rewrite."""

    def __init__(self, owner: "CompiledGraph", args: list) -> None:
        self.owner, self.gm, self.opts = owner, owner.gm, owner.opts
        self.flat = _flat_args(self.gm, args)
        params = [t for t in self.flat if isinstance(t, torch.nn.Parameter)]
        root = find_root(params)
        self.state: ModelPlan = plan_for(root, self.opts)
        self.state.attach(self)
        device = owner.step_device
        if device.type == "cuda":
            note = device_note(self.opts.hardware, torch.cuda.get_device_capability(device),
                               torch.cuda.get_device_name(device))
            self.state.device_notes.update([note] if note else [])
        aliases: dict[int, list[str]] = {}  # tied parameters have several names
        for n, p in (named_parameters(root) if root is not None else ()):
            aliases.setdefault(id(p), []).append(n)
        self.param_names = {id(p): aliases[id(p)] for p in params if id(p) in aliases}
        for names in self.param_names.values():
            self.state.param_names.update(names)
        self.prefix = frame_prefix(aliases, [(s, a) for s, a in zip(owner.sources, args)
                                             if isinstance(a, torch.nn.Parameter)])
        self.step_offset = path_key(module_name(self.prefix)) if self.prefix else 0
        self.module_names = {str(id(m)): n for n, m in named_modules(root)} if root else {}
        self.label: str | None = None
        self.calibrating_fn: Callable | None = None
        self.mutates_inputs = False  # an inference graph that writes its inputs (a static KV cache) is not run twice
        # the planned function of each (re-calibration, schedule phase), compiled on first need
        self.fns: dict[tuple[int, int], Callable] = {}
        self.compiling_phase = 0
        self.cal_runs = 0  # finished calibrating runs: backward passes of a training graph, or inference calls
        self.cal_epoch = 0  # ... in this calibration of the plan (option recalibrate_every)
        # finished backward passes, from the model's step when this graph is first met (a resumed run's
        # included): the schedule counts training steps by them
        self.backwards = self.state.train_steps

    def _calibrating(self) -> bool:
        state = self.state
        if state.fixed:
            return False
        if self.cal_epoch != state.epoch:
            self.cal_epoch, self.cal_runs = state.epoch, 0
        if self.cal_runs >= self.opts.calibrate:
            state.fix()
            return False
        return True

    def compiled(self) -> Callable:
        """The function for the next call: calibrating while the model's plan is open, else planned in the
        schedule's current phase (compiled on first need; the backend compiles the first one at dynamo's
        compile time, which dynamic shapes need: AOTAutograd may ask dynamo to restart its analysis)."""
        if self._calibrating():
            if self.calibrating_fn is None:
                self.calibrating_fn = self._aot(self._partition_calibrate, self._interpreter,
                                                self._inference_calibrate)
            return self.calibrating_fn
        key = (self.state.epoch, self.state.phase)
        if key not in self.fns:
            self.fns = {k: f for k, f in self.fns.items() if k[0] == key[0]}  # an earlier plan's never run again
            self.compiling_phase = key[1]
            self.fns[key] = self._aot(self._partition, self._inner_compiler(), self._inference)
        return self.fns[key]

    def __call__(self, *args):
        # filled on the graph's device (a kernel taking the count as an argument: no copy from the host)
        step = torch.full((), self.state.next_step() ^ self.step_offset, dtype=torch.int64,
                          device=self.owner.step_device)
        fn = self.compiled()
        out = fn(*args, step)
        if fn is self.calibrating_fn and self._replays():
            planned = self.compiled()
            if planned is not self.calibrating_fn:  # this call fixed the plan: its outputs in the plan's numerics
                out = planned(*args, step)
        return out

    def _replays(self) -> bool:
        """Whether an inference call that calibrated runs again under the plan it fixed, so that what it returns
        (a sampler's first logits, the KV cache of its prompts) is the plan's, as the RL phases need; not where
        the graph mutates its inputs, which a second run would mutate again (that call stays high precision and
        the plan says so)."""
        if not (self.opts.rl and self.label and self.label.startswith("infer")):
            return False
        if self.mutates_inputs:
            self.state.failures.append(f"{self.label} mutates its inputs, so its calibrating call was not run again "
                                       f"under the plan: that call's outputs are high precision")
        return not self.mutates_inputs

    def _aot(self, partition: Callable, compiler: Callable, inference: Callable) -> Callable:
        """AOTAutograd on fakes of dynamo's example inputs (``_backend_fakes``), inside dynamo's tracing context,
        so symbolic sizes stay symbolic even when this runs at a later call."""
        if compiler == self._interpreter:
            bw = lambda g, ex: compiler(g, ex, on_end=self._end_run)  # noqa: E731
        else:
            bw = lambda g, ex: self._counting(compiler(g, ex))  # noqa: E731
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
        if self.opts.inner != "inductor":
            return compile_once(self._compiler(), ("aot_eager",))
        from torch._inductor import config

        return compile_once(self._compiler(), ("inductor", self.opts.mode, config.get_hash()))

    def _compiler(self) -> Callable:
        if self.opts.inner != "inductor":
            return lambda g, example_inputs: make_boxed_func(g)
        from torch._inductor import config, list_mode_options
        from torch._inductor.compile_fx import compile_fx_inner

        patches = {} if self.opts.mode is None else list_mode_options(self.opts.mode)

        def compile_in_mode(g: fx.GraphModule, example_inputs):
            with config.patch(patches), keyed_by_autoprec():
                return compile_fx_inner(g, example_inputs)

        return compile_in_mode

    def _counting(self, fn: Callable) -> Callable:
        """A compiled backward (boxed: it takes the list of inputs) that counts the backward passes it runs."""
        def run(args):
            out = fn(args)
            self._backward_done()
            return out

        run._boxed_call = True
        return run

    def _backward_done(self) -> None:
        self.backwards += 1
        self.state.backward_done(self.backwards)

    def _end_run(self) -> None:
        self.cal_runs += 1
        self.state.calibration.end_run(id(self))
        if self.label and self.label.startswith("train"):
            self._backward_done()

    def _interpreter(self, gm: fx.GraphModule, example_inputs, on_end: Callable[[], None] | None = None) -> Callable:
        """Runs ``gm`` unchanged while measuring its GEMMs; ``on_end`` closes a calibrating run."""
        calibration = self.state.calibration
        return make_boxed_func(lambda *a: CalibratingInterpreter(gm, calibration, on_end).run(*a))

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

    def _decide(self, gm: fx.GraphModule, num_fwd_outputs: int | None, runner: PassRunner, only_forced: bool):
        """(gemms, {key: Decision}) of a graph, or None when a pass broke an internal invariant: the graph
        then runs as traced and the plan says so. Analysis and assignment leave the graph untouched."""
        try:
            gemms = self._gemms(gm, num_fwd_outputs, runner)
            specs = [g.spec for g in gemms]
            if only_forced:
                return gemms, runner.run("assign_forced", self.state.forced, specs)
            return gemms, runner.run("assign", self.state.decide, specs, self.label, self.compiling_phase)
        except PassError as exc:
            self.state.failures.append(str(exc))
            warnings.warn(f"{exc}; this graph runs as traced, without autoprec's formats", UserWarning, stacklevel=2)
            return None

    def _rewrite(self, gm: fx.GraphModule, num_fwd_outputs: int | None, gemms: list[GraphGemm],
                 decisions: dict, runner: PassRunner) -> None:
        """Rewrite the decided GEMMs; one whose shape in this graph cannot take its plan's blocks (a K
        that differs between graphs) runs in BF16 here, and the plan's row says so."""
        by_node: dict[fx.Node, Decision] = {}
        for g in gemms:
            d = decisions.get(g.spec.key)
            if d is None:
                continue
            problem = g.spec.blocking.get(d.fmt)
            if problem:
                self.state.deviate(g.spec.key, f"in {self.label}: {problem}, BF16")
                d = replace(d, fmt="bf16", rounding="rne", rht=False, tile2d=False)
            by_node[g.info.mm.node] = d
        infos = {g.info.mm.node: g.info for g in gemms}
        weight_key = f"{id(self.state)}" if self.opts.rl and num_fwd_outputs is None else None
        runner.run("rewrite_matmuls", rewrite_matmuls, gm, by_node, infos, self.opts,
                   StepInput(self._step(gm), self.step_offset), weight_key)
        runner.run("pair_quantizations", pair_quantizations, gm)
        if self.opts.inner == "inductor":  # a reduction inductor may fuse into x's producer; eagerly, several kernels
            runner.run("graph_amaxes", graph_amaxes, gm)
        for name, seconds in runner.timings.items():
            self.state.pass_seconds[name] = self.state.pass_seconds.get(name, 0.0) + seconds

    def _step(self, gm: fx.GraphModule) -> fx.Node:
        """The step input: the last of the non-tangent placeholders (it is the last user input)."""
        return [n for n in gm.graph.find_nodes(op="placeholder") if "tangents" not in n.name][-1]

    def _tag(self, gm: fx.GraphModule, num_fwd_outputs: int | None) -> None:
        """Calibration graph: forced GEMMs are rewritten already (so e.g. rl_trainer's forward matches
        its sampler from the first step); every other GEMM is tagged for measurement."""
        self.label = self.label or self.state.new_graph("infer" if num_fwd_outputs is None else "train")
        runner = PassRunner()
        decided = self._decide(gm, num_fwd_outputs, runner, only_forced=True)
        if decided is None:
            return
        gemms, forced = decided
        for g in gemms:
            if not g.spec.sdpa and g.spec.key not in forced:
                g.info.mm.node.meta[TAG] = GemmTag(g.spec.key, (id(self), g.pair),
                                                   g.info.grad_operand, g.info.weight_operand,
                                                   key_seeds(self.opts.seed, g.spec.key), g.info.mm.layout)
        self._rewrite(gm, num_fwd_outputs, gemms, forced, runner)

    def _plan_and_rewrite(self, gm: fx.GraphModule, num_fwd_outputs: int | None) -> None:
        self.label = self.label or self.state.new_graph("infer" if num_fwd_outputs is None else "train")
        runner = PassRunner()
        decided = self._decide(gm, num_fwd_outputs, runner, only_forced=False)
        if decided is None:
            return
        gemms, decisions = decided
        for g in gemms:
            self.state.weight_names.update(self.param_names.get(g.spec.weight_id, ()))
        ids = self._param_ids(gm)
        for g in gemms:
            for operand in (g.info.mm.a, g.info.mm.b):
                src = gathered_source(operand)
                if src in ids:
                    self.state.gathered_names.update(self.param_names.get(ids[src], ()))
        for op in runner.run("find_unplanned", find_unplanned, gm.graph, set(ids)):
            names = [n for p in op.params for n in self.param_names.get(ids[p], ())]
            self.state.note_unplanned(self.label, self._root_path(op.module_id, op.module_path), op.op, op.flops, names)
        self._rewrite(gm, num_fwd_outputs, gemms, decisions, runner)

    def _param_ids(self, gm: fx.GraphModule) -> dict[fx.Node, int]:
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
        meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
        self.mutates_inputs = bool(getattr(meta, "num_mutated_inp_runtime_indices", 0))
        self._tag(gm, None)
        return self._interpreter(gm, example_inputs, on_end=self._end_run)

    def _partition(self, joint: fx.GraphModule, joint_inputs, *, num_fwd_outputs: int, **kwargs):
        """The rewritten joint graph min-cut partitioned; a variant that rewrote to the joint graph another one did
        (a block of the same kind) takes copies of its partition (AOTAutograd goes on editing the ones it gets)."""
        self._plan_and_rewrite(joint, num_fwd_outputs)
        key = (joint.code, num_fwd_outputs, repr(sorted(kwargs.items())))
        kept = self.owner.partitions.get(key)
        if kept is None:
            fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
            self.owner.partitions[key] = (_copy(fw), _copy(bw))
        else:
            fw, bw = (_copy(g) for g in kept)
        self.state.saved_bytes[self.label] = saved_tensor_bytes(fw, num_fwd_outputs)
        return fw, bw

    def _inference(self, gm: fx.GraphModule, example_inputs):
        self._plan_and_rewrite(gm, None)
        return self._inner_compiler()(gm, example_inputs)


def _with_step_input(gm: fx.GraphModule, example_inputs: list,
                     device: torch.device) -> tuple[fx.GraphModule, list]:
    """A copy of ``gm`` (dynamo keeps reading the original) with a last input for the call counter, a 0-d
    int64 tensor on ``device``, and the example inputs with its example."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    phs = graph.find_nodes(op="placeholder")
    where = graph.inserting_after(phs[-1]) if phs else graph.inserting_before(next(iter(graph.nodes)))
    with where:
        node = graph.placeholder(STEP_INPUT)
    fake_mode = detect_fake_mode(example_inputs)
    value = torch.zeros((), dtype=torch.int64, device=device)
    value = fake_mode.from_tensor(value) if fake_mode is not None else value
    node.meta["example_value"] = node.meta["val"] = value
    return fx.GraphModule(gm, graph), [*example_inputs, value]


def _backend_fakes(example_inputs: list, context: torch._guards.TracingContext | None) -> list:
    """Dynamo's example inputs (real tensors) as fakes of the backend's fake mode, made as AOTAutograd makes
    them: a tensor dynamo fakified keeps its symbolic context, so its symbolic sizes stay symbolic and a
    dynamic Python float (``dynamic=True`` passes one as a 0-d tensor the graph reads with ``.item()``) keeps
    its symbol. (Dynamo's own fakes, the placeholders' ``example_value``, belong to its tracing fake mode, which
    AOTAutograd does not trace in; refakified there, a float's tensor loses its symbol and ``.item()`` fails.)
    Outside dynamo, or given fakes, the inputs as they are."""
    if context is None or context.fake_mode is None:
        return list(example_inputs)

    def fake(x):
        if not isinstance(x, torch.Tensor) or isinstance(x, FakeTensor):
            return x
        symbolic = context.tensor_to_context.get(x)
        return context.fake_mode.from_tensor(x, symbolic_context=symbolic,
                                             source=symbolic.tensor_source if symbolic is not None else None)

    return [fake(x) for x in example_inputs]


class CompiledGraph:
    """The callable handed back to dynamo: one compiled variant per set of parameter objects."""

    def __init__(self, gm: fx.GraphModule, opts: CompileOptions, example_inputs: list) -> None:
        self.opts = opts
        self.tracing_context = torch._guards.TracingContext.try_get()
        self.sources = [_source_name(n) for n in gm.graph.find_nodes(op="placeholder")]
        inputs = _backend_fakes(example_inputs, self.tracing_context)
        # the call counter lives where the graph computes: GPU kernels read it there (and a CUDA graph can
        # capture a step that reads it), CPU ones read it as a number
        self.step_device = next((t.device for t in inputs if isinstance(t, torch.Tensor) and t.device.type != "cpu"),
                                torch.device("cpu"))
        self.gm, self.example_inputs = _with_step_input(gm, inputs, self.step_device)
        self.variants: dict[tuple[int, ...], _Variant] = {}
        self.partitions: dict[tuple, tuple[fx.GraphModule, fx.GraphModule]] = {}  # by rewritten joint graph
        self._variant(list(example_inputs)).compiled()

    def _variant(self, args: list) -> _Variant:
        key = tuple(id(a) for a in args if isinstance(a, torch.nn.Parameter))
        if key not in self.variants:
            self.variants[key] = _Variant(self, args)
        return self.variants[key]

    def __call__(self, *args):
        return self._variant(list(args))(*args)


def _copy(g: fx.GraphModule) -> fx.GraphModule:
    """A graph module with a copy of ``g``'s graph (its nodes' metadata shallow-copied) and ``g``'s attributes."""
    return fx.GraphModule(g, copy.deepcopy(g.graph))


def _source_name(node: fx.Node) -> str | None:
    arg = node.meta.get("grapharg")
    source = getattr(arg, "source", None)
    return source.name if source is not None and isinstance(getattr(source, "name", None), str) else None


def autoprec_backend(gm: fx.GraphModule, example_inputs: list, options: dict | None = None,
                     mode: str | None = None) -> Callable:
    """torch.compile backend entry point (``backend="autoprec"``). torch.compile's ``mode`` selects the
    inductor inner compiler with that mode's settings (the plan's summary says so)."""
    opts = parse_options(options)
    if mode is not None:
        opts = replace(opts, inner="inductor", mode=mode)  # validated again, as any CompileOptions
    return CompiledGraph(gm, opts, example_inputs)
