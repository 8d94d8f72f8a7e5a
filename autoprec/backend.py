"""The ``autoprec`` torch.compile backend: wires dynamo's graphs to AOTAutograd and the pipeline.

Dynamo hands over an FX graph and real example inputs. Each set of parameter objects the graph is called with
(identical blocks after a graph break, or blocks compiled one by one) is a variant, named and planned by the modules
it really runs. A variant adds one input, the model's call counter XOR its module path's key (it seeds stochastic
rounding, so blocks with the same decisions rewrite to the same graph and share one inner compile), then runs
AOTAutograd: its partition function and inference compiler run the pipeline (``pipeline.py``: passes and the
planner's decisions) before the min-cut partition and the inner compiler. While the model's plan is open (recipe
``auto``) the variant first runs a measuring interpreter; once a graph has finished ``calibrate`` runs, the plan is
fixed for the whole model. See docs/design.md.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.fx as fx
from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor

from autoprec.inner_compiles import decompositions, inner_compiler
from autoprec.model_root import find_root, frame_prefix, module_name, named_modules, named_parameters
from autoprec.passes.calibrate import CalibratingInterpreter
from autoprec.passes.saved_bytes import saved_tensor_bytes
from autoprec.pipeline import GraphPipeline
from autoprec.planner.cost import device_note
from autoprec.planner.gemm_spec import path_key
from autoprec.planner.model_planner import ModelPlanner, planner_for
from autoprec.planner.options import CompileOptions, parse_options

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
        self.planner: ModelPlanner = planner_for(root, self.opts)
        self.planner.attach(self)
        device = owner.step_device
        if device.type == "cuda":
            note = device_note(self.opts.hardware, torch.cuda.get_device_capability(device),
                               torch.cuda.get_device_name(device))
            self.planner.device_notes.update([note] if note else [])
        aliases: dict[int, list[str]] = {}  # tied parameters have several names
        for n, p in (named_parameters(root) if root is not None else ()):
            aliases.setdefault(id(p), []).append(n)
        self.param_names = {id(p): aliases[id(p)] for p in params if id(p) in aliases}
        for names in self.param_names.values():
            self.planner.param_names.update(names)
        self.prefix = frame_prefix(aliases, [(s, a) for s, a in zip(owner.sources, args)
                                             if isinstance(a, torch.nn.Parameter)])
        self.step_offset = path_key(module_name(self.prefix)) if self.prefix else 0
        module_names = {str(id(m)): n for n, m in named_modules(root)} if root else {}
        self.pipeline = GraphPipeline(self.planner, self.opts, self.flat, self.param_names, self.prefix, module_names,
                                      self.step_offset, id(self))
        self.label: str | None = None
        self.calibrating_fn: Callable | None = None
        self.mutates_inputs = False  # an inference graph that writes its inputs (a static KV cache) is not run twice
        # the planned function of each (re-calibration, schedule stage), compiled on first need
        self.fns: dict[tuple[int, int], Callable] = {}
        self.compiling_stage = 0
        self.cal_runs = 0  # finished calibrating runs: backward passes of a training graph, or inference calls
        self.cal_epoch = 0  # ... in this calibration of the plan (option recalibrate_every)
        # finished backward passes, from the model's step when this graph is first met (a resumed run's
        # included): the schedule counts training steps by them
        self.backwards = self.planner.train_steps

    def _calibrating(self) -> bool:
        planner = self.planner
        if planner.fixed:
            return False
        if self.cal_epoch != planner.epoch:
            self.cal_epoch, self.cal_runs = planner.epoch, 0
        if self.cal_runs >= self.opts.calibrate:
            planner.fix()
            return False
        return True

    def compiled(self) -> Callable:
        """The function for the next call: calibrating while the model's plan is open, else planned in the
        schedule's current stage (compiled on first need; the backend compiles the first one at dynamo's
        compile time, which dynamic shapes need: AOTAutograd may ask dynamo to restart its analysis)."""
        if self._calibrating():
            if self.calibrating_fn is None:
                self.calibrating_fn = self._aot(self._partition_calibrate, self._interpreter,
                                                self._inference_calibrate)
            return self.calibrating_fn
        key = (self.planner.epoch, self.planner.stage)
        if key not in self.fns:
            self.fns = {k: f for k, f in self.fns.items() if k[0] == key[0]}  # an earlier plan's never run again
            self.compiling_stage = key[1]
            self.fns[key] = self._aot(self._partition, inner_compiler(self.opts.inner, self.opts.mode), self._inference)
        return self.fns[key]

    def __call__(self, *args):
        # filled on the graph's device (a kernel taking the count as an argument: no copy from the host)
        step = torch.full((), self.planner.next_step() ^ self.step_offset, dtype=torch.int64,
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
            self.planner.failures.append(f"{self.label} mutates its inputs, so its calibrating call was not run again "
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
                                         decompositions=decompositions(self.opts.inner))

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
        self.planner.backward_done(self.backwards)

    def _end_run(self) -> None:
        self.cal_runs += 1
        self.planner.calibration.end_run(id(self))
        if self.label and self.label.startswith("train"):
            self._backward_done()

    def _interpreter(self, gm: fx.GraphModule, example_inputs, on_end: Callable[[], None] | None = None) -> Callable:
        """Runs ``gm`` unchanged while measuring its GEMMs; ``on_end`` closes a calibrating run."""
        calibration = self.planner.calibration
        return make_boxed_func(lambda *a: CalibratingInterpreter(gm, calibration, on_end).run(*a))

    def _label(self, num_fwd_outputs: int | None) -> str:
        """This variant's graph label in the plan (``train0``, ``infer1``), given at its first trace."""
        self.label = self.label or self.planner.new_graph("infer" if num_fwd_outputs is None else "train")
        return self.label

    def _partition_calibrate(self, joint: fx.GraphModule, joint_inputs, *, num_fwd_outputs: int, **kwargs):
        self.pipeline.tag(joint, num_fwd_outputs, self._label(num_fwd_outputs))
        return min_cut_rematerialization_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)

    def _inference_calibrate(self, gm: fx.GraphModule, example_inputs):
        meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
        self.mutates_inputs = bool(getattr(meta, "num_mutated_inp_runtime_indices", 0))
        self.pipeline.tag(gm, None, self._label(None))
        return self._interpreter(gm, example_inputs, on_end=self._end_run)

    def _partition(self, joint: fx.GraphModule, joint_inputs, *, num_fwd_outputs: int, **kwargs):
        """The rewritten joint graph min-cut partitioned; a variant that rewrote to the joint graph another one did
        (a block of the same kind) takes copies of its partition (AOTAutograd goes on editing the ones it gets)."""
        self.pipeline.plan_and_rewrite(joint, num_fwd_outputs, self._label(num_fwd_outputs), self.compiling_stage)
        key = (joint.code, num_fwd_outputs, repr(sorted(kwargs.items())))
        kept = self.owner.partitions.get(key)
        if kept is None:
            fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
            self.owner.partitions[key] = (_copy(fw), _copy(bw))
        else:
            fw, bw = (_copy(g) for g in kept)
        self.planner.saved_bytes[self.label] = saved_tensor_bytes(fw, num_fwd_outputs)
        return fw, bw

    def _inference(self, gm: fx.GraphModule, example_inputs):
        self.pipeline.plan_and_rewrite(gm, None, self._label(None), self.compiling_stage)
        return inner_compiler(self.opts.inner, self.opts.mode)(gm, example_inputs)


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
