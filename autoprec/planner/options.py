"""Backend options (``torch.compile(..., options={...})``), validated into a frozen dataclass."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from autoprec.formats import closest
from autoprec.quant_spec import ScaleRule, values

from .cost import HARDWARE
from .overrides import parse_rules
from .plan import Plan, is_int, is_real

RECIPES = ("auto", "bf16", "mxfp8", "nvfp4", "nvfp4_nvidia", "fp8_block")
PHASES = ("pretrain", "rl_sampler", "rl_trainer", "rl")
RL_PHASES = PHASES[1:]
ACTIVATION_SCALES = ("dynamic", "static")
INNER = ("aot_eager", "inductor")
SCALE_MODES = values(ScaleRule)
COSTS = ("roofline", "at_scale")
MEASURES = ("eligible", "all")
REFERENCE_KEYS = ("d_model", "ffn", "tokens", "seq")
GRAD_WEIGHTS = {"noise": 0.25, "bias": 1.0}  # backward noise averages out over tokens and steps; bias does not


@dataclass(frozen=True)
class CompileOptions:
    """What the autoprec backend was asked to do.

    recipe: ``auto`` (calibrate, then solve among the hardware's menu of formats) or a preset: ``bf16``,
        ``mxfp8``, ``nvfp4`` (every GEMM, round-to-nearest), ``nvfp4_nvidia`` (NVIDIA's published NVFP4 recipe),
        ``fp8_block`` (every GEMM in FP8 with 1x128 blocks, 128x128 weight tiles: DeepSeek-V3's recipe, Hopper's).
    phase: ``pretrain``, ``rl_sampler`` (inference), ``rl_trainer`` (forward copied from ``match``) or ``rl``
        (one policy that both samples and trains, as TRL's GRPOTrainer runs it). In the RL phases every forward
        GEMM's output row depends only on its own input row and the weights (docs/rl.md).
    activation_scale: NVFP4's tensor scale of forward activations: ``dynamic`` (each tensor's own amax, the
        pretraining default) or ``static`` (an amax fixed at calibration, as inference engines' ``input_global_scale``;
        the default in the RL phases, where it makes the forward batch-invariant).
    calibrate: high-precision calibration steps before the plan is fixed (``auto`` only).
    measure: what calibration scores, ``eligible`` (the configurations the solver may pick) or ``all`` (also
        round-to-nearest on gradients and SR without the RHT on wgrad, which it never picks; slower, for
        studies of the damage model).
    recalibrate_every: with ``auto``, measure again and re-solve the plan every N training steps: after
        step k·N (backward passes completed), step k·N+1 runs as traced (high precision) while measuring,
        and the steps after it run the new plan. ``schedule`` overrides apply on top of each new plan.
    grad_weights: the damage of a backward GEMM's configuration is ``noise``·error + ``bias``·|bias|
        (defaults 0.25 and 1.0; fprop's is its loss-aware error), e.g. ``{"noise": 0.05}`` for a solver
        that spends less of its budget keeping gradients out of NVFP4.
    budget: quality budget, the mean damage allowed per GEMM (relative error scale, see plan docs).
    target_speedup: instead of a budget, the projected speedup to reach at least damage.
    hardware: cost-model table, ``gb300``, ``b200`` or ``h100``.
    match: the rl_sampler Plan (or its JSON path) whose forward numerics rl_trainer must reproduce.
    overrides: ``{"glob over module names": fmt or {role: fmt}}``; wins over the solver.
    plan: a Plan or a saved plan's path: use its decisions, skip calibration.
    inner: ``aot_eager`` (GraphModules) or ``inductor``.  seed: SR bits and RHT signs.
    mode: torch.compile's mode for the inductor inner compiler (``max-autotune-no-cudagraphs``, ...).
    mx_scale: E8M0 rule for MXFP8, ``rceil`` or ``floor``.
    schedule: precision phases, ``[{"from_step": S, "overrides": {glob: fmt or {role: fmt}}}, ...]``: from
        training step S (backward passes completed) on, the plan is the first plan with these overrides
        (and those of earlier phases) applied; e.g. ``{"*": {"fprop": "bf16"}}`` for the last 15% of steps.
    """

    recipe: str = "auto"
    phase: str = "pretrain"
    calibrate: int = 1
    measure: str = "eligible"
    budget: float = 0.01
    target_speedup: float | None = None
    hardware: str = "gb300"
    match: Any = None
    overrides: dict = field(default_factory=dict)
    plan: Any = None
    inner: str = "aot_eager"
    seed: int = 0
    mx_scale: str = "rceil"
    mode: str | None = None
    schedule: list = field(default_factory=list)
    cost: str = "roofline"
    reference_shapes: dict = field(default_factory=dict)
    grad_weights: dict = field(default_factory=dict)
    recalibrate_every: int | None = None
    activation_scale: str | None = None

    @property
    def rl(self) -> bool:
        return self.phase in RL_PHASES

    @property
    def static_activations(self) -> bool:
        """Whether forward activations take a static NVFP4 tensor scale (option ``activation_scale``)."""
        return (self.activation_scale or ("static" if self.rl else "dynamic")) == "static"

    def __post_init__(self) -> None:
        choices = (("recipe", RECIPES), ("phase", PHASES), ("inner", INNER), ("mx_scale", SCALE_MODES),
                   ("hardware", tuple(HARDWARE)), ("cost", COSTS), ("measure", MEASURES))
        for name, valid in choices:
            value = getattr(self, name)
            _need(name, value, isinstance(value, str), "a string")
            if value not in valid:
                raise ValueError(f"autoprec option {name}={value!r} is not valid; choose from {', '.join(valid)}")
        if self.activation_scale is not None:
            _need("activation_scale", self.activation_scale, isinstance(self.activation_scale, str), "a string or None")
            if self.activation_scale not in ACTIVATION_SCALES:
                raise ValueError(f"autoprec option activation_scale={self.activation_scale!r} is not valid; choose "
                                 f"from {', '.join(ACTIVATION_SCALES)}")
        for name in ("seed", "calibrate"):
            value = getattr(self, name)
            _need(name, value, is_int(value), "an int")
        if self.calibrate < 1:
            raise ValueError(f"autoprec option calibrate must be >= 1, got {self.calibrate}")
        _need("budget", self.budget, is_real(self.budget), "a number")
        if not (math.isfinite(self.budget) and self.budget >= 0):
            raise ValueError(f"autoprec option budget must be a finite number >= 0, got {self.budget}")
        if self.target_speedup is not None:
            _need("target_speedup", self.target_speedup, is_real(self.target_speedup), "a number or None")
            if not (math.isfinite(self.target_speedup) and self.target_speedup > 0):
                raise ValueError(f"autoprec option target_speedup must be a finite number > 0, "
                                 f"got {self.target_speedup}")
        if self.mode is not None:
            from torch._inductor import list_mode_options

            modes = tuple(list_mode_options())
            _need("mode", self.mode, isinstance(self.mode, str), "a string or None")
            if self.mode not in modes:
                raise ValueError(f"autoprec option mode={self.mode!r} is not valid; choose from {', '.join(modes)}")
            if self.inner != "inductor":
                raise ValueError(f"autoprec option mode={self.mode!r} needs inner='inductor'")
        _need("overrides", self.overrides, isinstance(self.overrides, dict), "a dict")
        check_schedule(self.schedule)
        _need("reference_shapes", self.reference_shapes, isinstance(self.reference_shapes, dict), "a dict")
        for key, value in self.reference_shapes.items():
            if key not in REFERENCE_KEYS:
                raise ValueError(f"autoprec option reference_shapes: unknown key {key!r}; valid: "
                                 f"{', '.join(REFERENCE_KEYS)}")
            if not is_int(value) or value <= 0:
                raise ValueError(f"autoprec option reference_shapes[{key!r}] must be a positive int, got {value!r}")
        if self.recalibrate_every is not None:
            _need("recalibrate_every", self.recalibrate_every, is_int(self.recalibrate_every), "an int or None")
            if self.recalibrate_every < 1:
                raise ValueError(f"autoprec option recalibrate_every must be >= 1, got {self.recalibrate_every}")
            if self.recipe != "auto" or self.plan is not None:
                raise ValueError("autoprec option recalibrate_every needs recipe='auto' without a plan: it re-solves "
                                 "the plan from new measurements")
        _need("grad_weights", self.grad_weights, isinstance(self.grad_weights, dict), "a dict")
        for key, value in self.grad_weights.items():
            if key not in GRAD_WEIGHTS:
                raise ValueError(f"autoprec option grad_weights: unknown key {key!r}; valid: {', '.join(GRAD_WEIGHTS)}")
            if not is_real(value) or not (math.isfinite(value) and value >= 0):
                raise ValueError(f"autoprec option grad_weights[{key!r}] must be a finite number >= 0, got {value!r}")
        if (self.phase == "rl_trainer") != (self.match is not None):
            raise ValueError(
                "autoprec option match (the rl_sampler plan) goes with phase='rl_trainer', and it needs one"
            )
        for name in ("plan", "match"):
            value = getattr(self, name)
            _need(name, value, value is None or isinstance(value, (str, Path, Plan)),
                  "an autoprec.Plan or the path of a saved plan")
            if isinstance(value, (str, Path)) and not Path(value).is_file():
                raise ValueError(f"autoprec option {name}: no plan file at {str(value)!r}")

    def damage_weights(self) -> tuple[float, float]:
        """(noise, bias) weights of a backward GEMM's damage: the defaults with ``grad_weights`` applied."""
        w = {**GRAD_WEIGHTS, **self.grad_weights}
        return float(w["noise"]), float(w["bias"])


SCHEDULE_KEYS = ("from_step", "overrides")


def check_schedule(schedule: Any) -> None:
    """A schedule is a list of phases {"from_step": int >= 1, "overrides": {glob: fmt | {role: fmt}}} with
    strictly increasing steps; the override rules are checked as the ``overrides`` option's."""
    _need("schedule", schedule, isinstance(schedule, list), "a list of {'from_step': int, 'overrides': dict}")
    last = 0
    for i, phase in enumerate(schedule):
        where = f"autoprec option schedule[{i}]"
        if not isinstance(phase, dict) or set(phase) != set(SCHEDULE_KEYS):
            raise ValueError(f"{where} must be a dict with exactly the keys {', '.join(SCHEDULE_KEYS)}, got {phase!r}")
        step = phase["from_step"]
        if not is_int(step) or step <= last:
            raise ValueError(f"{where}: from_step must be an int greater than {last} (steps increase), got {step!r}")
        _need(f"schedule[{i}].overrides", phase["overrides"], isinstance(phase["overrides"], dict), "a dict")
        parse_rules(phase["overrides"])
        last = step


def _need(name: str, value: Any, ok: bool, what: str) -> None:
    """TypeError naming option ``name`` unless ``ok``."""
    if not ok:
        raise TypeError(f"autoprec option {name} must be {what}, got {type(value).__name__} {value!r}")


def parse_options(options: dict | CompileOptions | None) -> CompileOptions:
    """Options from the user's dict; an unknown key raises ValueError naming the valid ones."""
    if options is None:
        return CompileOptions()
    if isinstance(options, CompileOptions):
        return options
    if not isinstance(options, dict):
        raise TypeError(f"autoprec options must be a dict, got {type(options).__name__}")
    valid = [f.name for f in fields(CompileOptions)]
    for key in options:
        if key not in valid:
            raise ValueError(
                f"unknown autoprec option {key!r}; closest: {closest(str(key), valid)} "
                f"(valid options: {', '.join(valid)})"
            )
    return CompileOptions(**options)
