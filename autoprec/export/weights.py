"""What an export writes, format by format: each Linear's planned fprop format, its weight quantized as the
plan's forward quantizes it, and the static activation amax the plan fixed. See docs/export.md."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from autoprec.api import _model_plans, plan
from autoprec.formats import get_format
from autoprec.kernels import dequantize, quantize
from autoprec.kernels.core.quantized import QuantizedTensor
from autoprec.kernels.reference.nvfp4 import nvfp4_encode_scale
from autoprec.planner.plan import Decision
from autoprec.roles import MatmulRole

EXPORTED_FORMATS = ("nvfp4", "mxfp8")


@dataclass(frozen=True)
class QuantizedLinear:
    """One Linear's weight as the plan's forward runs it. ``scales`` has one row per weight row (a 16x16 tile's
    scale repeated over its 16 rows, which gives the same values); ``s_dec`` is NVFP4's fp32 tensor scale.
    ``activations``: whether the checkpoint says how the input is quantized (the same format: NVFP4 with the static
    ``input_amax``, MXFP8 with per-block scales), or leaves the input unquantized (weights only)."""

    name: str
    fmt: str
    codes: torch.Tensor
    scales: torch.Tensor
    s_dec: torch.Tensor | None
    activations: bool
    input_amax: float | None

    def weight_values(self) -> torch.Tensor:
        """fp32 values of the quantized weight, as autoprec dequantizes them."""
        n, k = self.codes.shape[0], self.scales.shape[1] * get_format(self.fmt).block_size
        q = QuantizedTensor(get_format(self.fmt), self.codes, self.scales, self.s_dec, 1, torch.Size((n, k)))
        return dequantize(q)

    def input_global_scale(self) -> torch.Tensor:
        """NVFP4's activation S_enc for the static amax, as the quantizer computes it (shape [1], fp32)."""
        return nvfp4_encode_scale(torch.tensor([self.input_amax], dtype=torch.float32))


@dataclass
class ExportPlan:
    """A model's root module, the Linears it exports quantized and the modules kept in their own dtype."""

    root: torch.nn.Module
    linears: list[QuantizedLinear]
    kept: list[str]  # Linear modules in their own dtype (BF16 in the plan, or never planned)
    notes: list[str]


def export_plan(model: torch.nn.Module, activations: str) -> ExportPlan:
    """The export of ``model``'s current plan. ``activations``: ``"plan"`` (activation formats as the plan
    quantizes them) or ``"none"`` (weights only)."""
    root, planners, _ = _model_plans(model)
    if not planners:
        plan(model)  # raises, naming what to do
    decisions = {d.module: d for d in plan(model).decisions if d.role is MatmulRole.FPROP}
    scale_mode = planners[-1].opts.mx_scale
    linears, kept, notes = [], [], []
    planned = set()
    for name, module in root.named_modules():
        d = decisions.get(name)
        if d is not None and d.groups:
            raise ValueError(f"autoprec.export: {name!r} is an experts module (grouped GEMMs); exporting experts is "
                             f"not supported yet")
        if not isinstance(module, torch.nn.Linear):
            if d is not None and d.fmt != "bf16" and isinstance(getattr(module, "weight", None), torch.Tensor):
                raise ValueError(f"autoprec.export: {name!r} is a {type(module).__name__}, not an nn.Linear, and runs "
                                 f"{d.fmt}: the checkpoint formats quantize nn.Linear weights only; keep it in BF16 "
                                 f"(options={{'overrides': {{{name!r}: {{'fprop': 'bf16'}}}}}}) to export")
            continue
        planned.add(name)
        if d is None or d.fmt == "bf16" or not d.rewritten:
            kept.append(name)
            continue
        if d.fmt not in EXPORTED_FORMATS:
            raise ValueError(f"autoprec.export: {name!r} runs {d.fmt}, which the checkpoint formats cannot say")
        linears.append(_quantized(name, module.weight.detach(), d, scale_mode, activations))
    others = sorted(d.module for d in decisions.values() if d.module not in planned and d.fmt != "bf16")
    if others:
        notes.append("products without a Linear weight run in the plan's formats inside autoprec but are not in the "
                     "checkpoint (engines run them their own way): " + ", ".join(others))
    return ExportPlan(root, linears, kept, notes)


def _quantized(name: str, weight: torch.Tensor, d: Decision, scale_mode: str, activations: str) -> QuantizedLinear:
    if weight.ndim != 2:
        raise ValueError(f"autoprec.export: {name!r} has a {weight.ndim}D weight; a Linear's is 2D")
    q = quantize(weight, d.fmt, 1, tile2d=d.tile2d, scale_mode=scale_mode)
    scales = q.scales.repeat_interleave(16, dim=0) if q.tile_rows == 16 else q.scales
    amax = d.input_amax[0] if d.input_amax else None
    if d.fmt == "nvfp4" and activations == "plan" and amax is None:
        raise ValueError(
            f"autoprec.export: {name!r} runs NVFP4 with a dynamic activation tensor scale (each batch's own amax), "
            f"which a checkpoint cannot say: its formats carry one static input global scale. Compile with "
            f"options={{'activation_scale': 'static'}} (the RL phases' default), or export weights only "
            f"(activations='none')")
    return QuantizedLinear(name, d.fmt, q.codes.contiguous(), scales.contiguous(), q.tensor_scale,
                           activations == "plan", amax)
