"""The planner of one model: it aggregates calibration and holds the model's plan, one Decision per GEMM key
(root-relative module path, role, ordinal), shared by every graph of a model (graph-break frames, train / eval,
prefill / decode, recompiles) and by every rank. It owns the model's calibration (aggregated over graphs, steps
and ranks), the call counter that seeds stochastic rounding, and the record of which graphs run which GEMM.

A ModelPlanner belongs to one root module (the model: ``model_root``) and one set of options. The backend finds
the root from the parameters a graph receives, so one compiled graph that serves several module instances
(identical blocks after a graph break, or compiled one by one) maps each call to its own modules.
"""
from __future__ import annotations

import gc
import warnings
import weakref
from dataclasses import replace

import torch

from autoprec.model_root import holds, named_modules

from .assign import Assigner
from .at_scale import SOURCES, ReferenceShapes
from .calibration import Calibration
from .cost import get_hardware
from .gemm_spec import GemmKey, GemmSpec
from .options import CompileOptions
from .overrides import annotated_modules
from .plan import Decision, Plan


class ModelPlanner:
    """The plan of one model under one set of options (see the module docstring). ``requested`` are the
    options the user compiled with; ``opts`` may differ by a plan restored with ``load_state_dict``."""

    def __init__(self, root: torch.nn.Module | None, requested: CompileOptions, opts: CompileOptions) -> None:
        self._root_ref = weakref.ref(root) if root is not None else None
        self.requested, self.opts = requested, opts
        self.specs: dict[GemmKey, GemmSpec] = {}
        self.decisions: dict[GemmKey, Decision] = {}
        self.graphs: dict[GemmKey, list[str]] = {}  # labels of the graphs each GEMM runs in
        self.saved_bytes: dict[str, int] = {}
        self.pass_seconds: dict[str, float] = {}
        self.failures: list[str] = []
        self.device_notes: set[str] = set()  # GPUs the graphs run on that the cost table does not describe
        self.deviations: dict[GemmKey, list[str]] = {}  # graphs where a GEMM's shape forced another format
        self.param_names: set[str] = set()  # root-relative names of the parameters the graphs received
        self.weight_names: set[str] = set()  # ... and of those that feed planned GEMMs
        self.unplanned: dict[tuple[str, str, int], float | None] = {}  # matmul-like ops left as they are
        self.unplanned_params: dict[str, str] = {}  # parameter name -> the unplanned op that reads it
        self.gathered_names: set[str] = set()  # parameters planned GEMMs read through an index (expert weights)
        self._unplanned_seen: dict[str, dict[tuple[str, str], int]] = {}
        self.calls = 0  # compiled calls of any graph of the model: the SR step
        self.train_steps = 0  # the most backward passes any one training graph has finished: the schedule's step
        self._staged: dict[tuple[int, GemmKey], Decision] = {}
        self.n_graphs = 0
        self._variants: list[weakref.ref] = []
        auto = opts.recipe == "auto" and opts.plan is None
        recalibrates = requested.recalibrate_every is not None  # also when a restored plan runs first
        # a preset with static activation scales calibrates too, to measure its activations' amaxes only
        scales = opts.static_activations and opts.plan is None and opts.recipe not in ("bf16", "mxfp8", "fp8_block")
        scope = opts.measure if auto or recalibrates else "amax"
        menu = get_hardware(opts.hardware).formats
        calibrates = auto or recalibrates or scales
        self.calibration = Calibration(opts.mx_scale, opts.seed, scope, menu) if calibrates else None
        self.fixed = not (auto or scales)
        self.recalibrated: list[int] = []  # training steps after which re-calibrations began (recalibrate_every)
        self._module_names = list(dict.fromkeys(n for n, _ in named_modules(root, True))) if root is not None else None
        self._assigner = Assigner(opts, self.calibration, self._module_names) if root is not None else None

    @property
    def model(self) -> torch.nn.Module | None:
        return self._root_ref() if self._root_ref is not None else None

    @property
    def alive(self) -> bool:
        return any(v() is not None for v in self._variants)

    def attach(self, variant: object) -> None:
        self._variants.append(weakref.ref(variant))

    def new_graph(self, kind: str) -> str:
        self.n_graphs += 1
        return f"{kind}{self.n_graphs - 1}"

    def next_step(self) -> int:
        self.calls += 1
        return self.calls

    def assigner_with(self, opts: CompileOptions) -> Assigner:
        """An assigner over this model's calibration, module names and GEMMs under ``opts`` (a re-calibrated plan's
        options, or the front's targets)."""
        names = self._module_names
        assigner = Assigner(opts, self.calibration,
                            names if names is not None else sorted({s.module for s in self.specs.values()}))
        assigner.set_specs(list(self.specs.values()))
        return assigner

    def assigner(self, specs: list[GemmSpec]) -> Assigner:
        """The assigner; without a root module, checked against the first graph's module paths."""
        if self._assigner is None:
            self._assigner = Assigner(self.opts, self.calibration, sorted({s.module for s in specs}))
        self._assigner.set_specs(list(self.specs.values()))
        return self._assigner

    def register(self, specs: list[GemmSpec]) -> None:
        for s in specs:
            self.specs.setdefault(s.key, s)

    def _add(self, choices: dict, prefix: str = "") -> None:
        sites = {}
        for key in self.specs:
            sites.setdefault(key[0], len(sites))
        assigner = self._assigner
        for key, choice in choices.items():
            if key not in self.decisions:
                c, reason = choice
                self.decisions[key] = assigner.decision(self.specs[key], (c, prefix + reason), sites[key[0]])

    def forced(self, specs: list[GemmSpec]) -> dict[GemmKey, Decision]:
        """Decisions fixed before any measurement (overrides, plan file, matched sampler forward), and
        those already made for these keys."""
        self.register(specs)
        todo = [s for s in specs if s.key not in self.decisions]
        assigner = self.assigner(specs)
        # one that needs static activation amaxes nobody has measured yet waits for calibration to measure them
        self._add({k: c for k, c in assigner.choose(todo, only_forced=True).items()
                   if not assigner.pending_amax(self.specs[k], c)})
        return {s.key: self.decisions[s.key] for s in specs if s.key in self.decisions}

    def fix(self) -> None:
        """Decide every GEMM seen so far, with the calibration of all graphs (and ranks)."""
        if self.calibration is not None:
            reduce_across_ranks(self.calibration)
            self.calibration.keep_unmeasured()
        specs = list(self.specs.values())
        self._add(self.assigner(specs).choose([s for s in specs if s.key not in self.decisions]))
        self.fixed = True

    def stage_at(self, step: int) -> int:
        """The schedule stage that runs at training step ``step`` (0: the plan before any switch)."""
        return sum(1 for p in self.opts.schedule if step >= p["from_step"])

    @property
    def stage(self) -> int:
        return self.stage_at(self.train_steps)

    def backward_done(self, count: int) -> None:
        """A training graph has finished its ``count``-th backward pass; after every ``recalibrate_every``-th
        training step of a fixed plan, the plan opens again: the next step measures, then it is re-solved."""
        self.train_steps = max(self.train_steps, count)
        every = self.requested.recalibrate_every
        if every and self.fixed and self.train_steps % every == 0 and self.train_steps not in self.recalibrated:
            self._recalibrate()

    @property
    def epoch(self) -> int:
        """Re-calibrations begun so far: which plan of the run this is."""
        return len(self.recalibrated)

    def _recalibrate(self) -> None:
        self.recalibrated.append(self.train_steps)
        self.opts = self.requested  # a plan restored from a checkpoint ran until now
        if self._module_names is not None:
            self._assigner = self.assigner_with(self.opts)
        self.calibration.restart()
        self.decisions.clear()
        self._staged.clear()
        self.fixed = False

    def stage_decision(self, key: GemmKey, stage: int) -> Decision:
        """The decision of ``key`` in schedule stage ``stage``: the plan's, with the stages' overrides."""
        if stage == 0:
            return self.decisions[key]
        if (stage, key) not in self._staged:
            choice = self._assigner.scheduled(self.specs[key], stage)
            base = self.decisions[key]
            self._staged[(stage, key)] = base if choice is None else self._assigner.decision(
                self.specs[key], choice, base.site)
        return self._staged[(stage, key)]

    def decide(self, specs: list[GemmSpec], graph: str, stage: int = 0) -> dict[GemmKey, Decision]:
        """The decision of every GEMM of a graph in schedule stage ``stage``; one first met after the plan
        was fixed is decided now, by the same policy, and says so."""
        self.register(specs)
        new = [s for s in specs if s.key not in self.decisions]
        if new:
            prefix = f"decided after the plan was fixed (first met in {graph}): " if self.calibration else ""
            self._add(self.assigner(specs).choose(new), prefix)
        for s in specs:
            runs = self.graphs.setdefault(s.key, [])
            if graph not in runs:
                runs.append(graph)
        _warn_stray_annotations()
        return {s.key: self.stage_decision(s.key, stage) for s in specs}

    def note_unplanned(self, graph: str, module: str, op: str, flops: float | None, params: list[str]) -> None:
        """A matmul-like op autoprec does not rewrite: counted once per (module, op, ordinal), as GEMMs are."""
        seen = self._unplanned_seen.setdefault(graph, {})
        ordinal = seen.get((module, op), 0)
        seen[(module, op)] = ordinal + 1
        self.unplanned.setdefault((module, op, ordinal), flops)
        for name in params:
            self.unplanned_params.setdefault(name, op)

    def deviate(self, key: GemmKey, why: str) -> None:
        notes = self.deviations.setdefault(key, [])
        if why not in notes:
            notes.append(why)

    def to_plan(self, stage: int | None = None) -> Plan:
        """The user's view of schedule stage ``stage`` (default: the one running now): each key once,
        with the graphs it runs in, and the schedule."""
        hardware = self.opts.hardware
        stage = self.stage if stage is None else stage
        reference = f"{ReferenceShapes(**self.opts.reference_shapes).describe()}; {SOURCES[hardware]}"
        if not 0 <= stage <= len(self.opts.schedule):
            raise ValueError(f"autoprec.plan: stage {stage} does not exist; the schedule has stages "
                             f"0..{len(self.opts.schedule)}")
        rows = [replace(d, graphs=tuple(self.graphs.get(k, ())),
                        reason="; ".join([d.reason, *self.deviations.get(k, [])]))
                for k, d in ((k, self.stage_decision(k, stage)) for k in self.decisions)]
        rows.sort(key=lambda d: d.site)
        notes = [f"a compiled graph ran as traced, without autoprec's formats: {f}" for f in self.failures]
        notes += sorted(self.device_notes)
        if self.opts.mode is not None:
            notes.append(f"torch.compile mode={self.opts.mode!r}: inner compiler inductor with that mode's settings")
        if self.opts.static_activations:
            notes.append("static NVFP4 activation scales (fixed at calibration; each fprop row's 'static activation "
                         "amax'): every forward GEMM's output row depends only on its own input row and the weights, "
                         "so a sampler and a matched trainer agree bit for bit (docs/rl.md)")
        return Plan(decisions=rows, saved_bytes=dict(self.saved_bytes), hardware=hardware, reference=reference,
                    pass_seconds=dict(self.pass_seconds), notes=notes,
                    unplanned_ops=[(m, op, f) for (m, op, _), f in self.unplanned.items()],
                    schedule=self._schedule_lines(stage) + self._recalibration_lines())

    def _schedule_lines(self, shown: int) -> list[str]:
        """One line per schedule stage: when it starts, its rules, what it changes and its projection."""
        if not self.opts.schedule:
            return []
        lines = []
        for stage in range(len(self.opts.schedule) + 1):
            rows = [self.stage_decision(k, stage) for k in self.decisions]
            changed = sum(1 for k, d in zip(self.decisions, rows) if d.fmt != self.decisions[k].fmt)
            plan = Plan(decisions=rows, hardware=self.opts.hardware)
            start = "from step 0" if stage == 0 else f"from step {self.opts.schedule[stage - 1]['from_step']}"
            rules = "the plan" if stage == 0 else f"overrides {self.opts.schedule[stage - 1]['overrides']}"
            marks = [m for m, on in (("running now", stage == self.stage), ("the rows above", stage == shown)) if on]
            lines.append(f"schedule stage {stage} {start}: {rules}; {changed} GEMMs differ from stage 0; projected "
                         f"speedup {plan.projected_speedup():.2f}x, at scale {plan.projected_speedup(True):.2f}x"
                         + (f" ({', '.join(marks)})" if marks else ""))
        return lines

    def _recalibration_lines(self) -> list[str]:
        every = self.requested.recalibrate_every
        if not every:
            return []
        if not self.recalibrated:
            now = "these rows are the first plan"
        elif self.fixed:
            now = f"these rows were measured in the step after step {self.recalibrated[-1]}"
        else:
            now = (f"measuring now, in the step after step {self.recalibrated[-1]}: the new plan is fixed at the "
                   "next call")
        return [f"re-calibrates every {every} training steps (each time the next step runs as traced, in high "
                f"precision, while measuring); {now}"]

    def state_dict(self) -> dict:
        plan = self.to_plan(stage=0).to_json() if self.fixed else None
        return {"calls": self.calls, "train_steps": self.train_steps, "plan": plan}

    def load_state_dict(self, state: dict) -> None:
        self.calls = int(state["calls"])
        self.train_steps = int(state.get("train_steps", 0))
        for variant in (v() for v in self._variants):
            if variant is not None:
                variant.backwards = self.train_steps  # its graphs count on from the restored step


PLANNERS: list[ModelPlanner] = []
_PENDING: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def planner_for(root: torch.nn.Module | None, opts: CompileOptions) -> ModelPlanner:
    """The live ModelPlanner of ``root`` under ``opts`` (a new one if there is none)."""
    PLANNERS[:] = [s for s in PLANNERS if s.alive or not s._variants]
    for state in PLANNERS:
        if root is not None and state.model is root and state.requested == opts:
            return state
    requested = opts
    key = _pending_key(root) if root is not None else None
    pending = _PENDING.pop(key) if key is not None else None
    if pending is not None and pending.get("plan") is not None and opts.recipe == "auto" and opts.plan is None:
        # the restored plan runs until the next re-calibration, if any (that reads ``requested``)
        opts = replace(opts, plan=Plan.from_json(pending["plan"], "autoprec.load_state_dict"), recalibrate_every=None)
    state = ModelPlanner(root, requested, opts)
    if pending is not None:
        state.load_state_dict(pending)
    PLANNERS.append(state)
    return state


def _pending_key(root: torch.nn.Module) -> torch.nn.Module | None:
    """The module a state was deferred on for ``root``'s plan: ``root``, or a module of its tree (a model whose
    blocks are compiled one by one is planned at the top of its tree, e.g. a DDP wrapper)."""
    if root in _PENDING:
        return root
    return next((k for k in list(_PENDING.keys()) if holds(root, k) or holds(k, root)), None)


def planners_of(model: torch.nn.Module | None) -> list[ModelPlanner]:
    """The live plans of a model (None: of every model), the most recent last."""
    gc.collect()  # graphs dropped by torch._dynamo.reset() (or recompiles) take their plans along
    PLANNERS[:] = [s for s in PLANNERS if s.alive]
    return [s for s in PLANNERS if model is None or s.model is model]


def enclosing_planners(module: torch.nn.Module) -> list[ModelPlanner]:
    """The live plans of models that hold ``module`` (a block compiled on its own is planned with its model)."""
    return [s for s in planners_of(None) if s.model is not None and s.model is not module and holds(s.model, module)]


def planned_module_ids() -> set[str]:
    """Ids of the modules (and their ancestors) whose GEMMs a live plan has decided."""
    return {mid for st in PLANNERS if st.alive for k in st.decisions for mid in st.specs[k].stack_ids}


def planned_weight_ids() -> set[int]:
    """Ids of the parameters whose GEMMs a live plan has decided."""
    return {st.specs[k].weight_id for st in PLANNERS if st.alive for k in st.decisions} - {None}


def defer_state(model: torch.nn.Module, state: dict) -> None:
    """Keep a state dict for the plan ``model`` gets at its first compiled call."""
    _PENDING[model] = state


_WARNED: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def _warn_stray_annotations() -> None:
    """``annotate`` on a module that no compiled model holds is ignored: warn once per module when a graph is planned,
    naming the module and its annotation (``autoprec.plan`` lists it too)."""
    roots = [s.model for s in PLANNERS if s.model is not None]
    for module, spec in annotated_modules():
        if module not in _WARNED and not any(holds(r, module) for r in roots):
            _WARNED.add(module)
            formats = ", ".join(f"{role}={fmt}" for role, fmt in spec.items())
            warnings.warn(f"autoprec.annotate({type(module).__name__}, {formats}): this module is not part of any "
                          f"model compiled so far, so the annotation is ignored (annotate the modules of the model "
                          f"you compile)", UserWarning, stacklevel=2)


def reduce_across_ranks(calibration: Calibration) -> None:
    """Under torch.distributed, every rank's measurements (scores, problems, tokens per expert) are
    gathered and merged in rank order, so every rank solves the same problem and runs the identical plan."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (calibration.stats, calibration.problems, calibration.group_tokens,
                                      calibration.amaxes))
    merged = Calibration(calibration.mx_scale, calibration.rht_seed, calibration.scope, calibration.menu)
    for stats, problems, tokens, amaxes in gathered:
        merged.merge(Calibration(calibration.mx_scale, calibration.rht_seed, calibration.scope, calibration.menu,
                                 stats, problems, tokens, amaxes))
    calibration.stats, calibration.problems = merged.stats, merged.problems
    calibration.group_tokens, calibration.amaxes = merged.group_tokens, merged.amaxes
