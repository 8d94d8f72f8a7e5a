"""What an export writes: each planned weight's fprop format, the weight quantized as the plan's forward quantizes it,
and the static activation amax the plan fixed. See docs/export.md."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from autoprec.api import model_planner, plan
from autoprec.formats import get_format
from autoprec.kernels import dequantize, quantize
from autoprec.kernels.core.quantized import QuantizedTensor
from autoprec.kernels.reference.nvfp4 import nvfp4_encode_scale
from autoprec.planner.plan import Decision
from autoprec.roles import MatmulRole

EXPORTED_FORMATS = ("nvfp4", "mxfp8", "fp8_block")


@dataclass(frozen=True)
class QuantizedWeight:
    """A Linear's weight (N, K), or an experts parameter (E, N, K) with one quantization per expert, as the plan's
    forward runs it. ``param``: its name in the model's state dict. ``scales`` has one row per weight row (a 16x16
    tile's scale repeated over its 16 rows: the same values), except FP8-block's 128x128 tiles (``tile_rows`` 128),
    one fp32 scale per tile as the format's block strategy stores them; ``s_dec``: NVFP4's fp32 tensor scale, one per
    expert.
    ``activations``: whether the checkpoint says how the input is quantized (the same format: NVFP4 under the
    static ``input_amax``, MXFP8 with per-block scales) or leaves it unquantized (weights only)."""

    param: str
    fmt: str
    codes: torch.Tensor
    scales: torch.Tensor
    s_dec: torch.Tensor | None
    activations: bool
    input_amax: float | None
    tile_rows: int = 1

    @property
    def module(self) -> str:
        return self.param.removesuffix(".weight")

    @property
    def scheme(self) -> str:
        """The checkpoint scheme: the format, and for FP8-block its weight blocks (128x128 tiles or 1x128 rows)."""
        if self.fmt == "fp8_block":
            return "fp8_block" if self.tile_rows > 1 else "fp8_block_rows"
        return self.fmt

    def weight_values(self) -> torch.Tensor:
        """fp32 values of the quantized weight, as autoprec dequantizes them."""
        fmt = get_format(self.fmt)
        if self.codes.ndim == 3:
            return torch.stack([self._expert(e).weight_values() for e in range(self.codes.shape[0])])
        shape = torch.Size((self.codes.shape[0], self.scales.shape[1] * fmt.block_size))
        return dequantize(QuantizedTensor(fmt, self.codes, self.scales, self.s_dec, 1, shape, self.tile_rows))

    def _expert(self, e: int) -> "QuantizedWeight":
        s_dec = None if self.s_dec is None else self.s_dec[e]
        return QuantizedWeight(self.param, self.fmt, self.codes[e], self.scales[e], s_dec, self.activations,
                               self.input_amax, self.tile_rows)

    def input_global_scale(self) -> torch.Tensor:
        """NVFP4's activation S_enc for the static amax, as the quantizer computes it (shape [1], fp32)."""
        return nvfp4_encode_scale(torch.tensor([self.input_amax], dtype=torch.float32))


@dataclass
class ExportPlan:
    """A model's root module, the weights it exports quantized and the Linear modules kept in their own dtype."""

    root: torch.nn.Module
    weights: list[QuantizedWeight]
    kept: list[str]  # Linear modules in their own dtype (BF16 in the plan, or never planned)
    notes: list[str]


def export_plan(model: torch.nn.Module, activations: str) -> ExportPlan:
    """The export of ``model``'s current plan. ``activations``: ``"plan"`` (activation formats as the plan
    quantizes them) or ``"none"`` (weights only)."""
    planner = model_planner(model, "autoprec.export")
    root = planner.model
    fprops: dict[str, list[Decision]] = {}
    for d in plan(model).decisions:
        if d.role is MatmulRole.FPROP:
            fprops.setdefault(d.module, []).append(d)
    scale_mode = planner.opts.mx_scale
    weights, kept, notes, seen = [], [], [], set()
    for name, module in root.named_modules():
        ds = [d for d in fprops.get(name, []) if d.fmt != "bf16" and d.rewritten]
        if isinstance(module, torch.nn.Linear):
            seen.add(name)
            if not ds:
                kept.append(name)
                continue
            weights.append(_quantized(f"{name}.weight", module.weight.detach(), ds[0], scale_mode, activations))
        elif ds and any(d.groups for d in ds):
            seen.add(name)
            weights += _experts(name, module, ds, scale_mode, activations)
        elif ds and isinstance(getattr(module, "weight", None), torch.Tensor):
            raise ValueError(f"autoprec.export: {name!r} is a {type(module).__name__}, not an nn.Linear, and runs "
                             f"{ds[0].fmt}: the checkpoint formats quantize nn.Linear weights only; keep it in BF16 "
                             f"(options={{'overrides': {{{name!r}: {{'fprop': 'bf16'}}}}}}) to export")
    others = sorted(m for m, ds in fprops.items() if m not in seen and any(d.fmt != "bf16" for d in ds))
    if others:
        notes.append("products without a Linear weight run in the plan's formats inside autoprec but are not in the "
                     "checkpoint (engines run them their own way): " + ", ".join(others))
    return ExportPlan(root, weights, kept, notes)


def _experts(name: str, module: torch.nn.Module, ds: list[Decision], scale_mode: str,
             activations: str) -> list[QuantizedWeight]:
    """An experts module's planned 3D parameters, each matched to its decision by shape."""
    params = {n: p for n, p in module.named_parameters(recurse=False) if p.ndim == 3}
    out = []
    for d in ds:
        matches = [n for n, p in params.items() if d.weight_shape is not None and tuple(p.shape) == d.weight_shape]
        if len(matches) != 1:
            raise ValueError(f"autoprec.export: {name!r} GEMM {d.index}: no single expert parameter of shape "
                             f"{d.weight_shape} among {', '.join(f'{n} {tuple(p.shape)}' for n, p in params.items())}")
        out.append(_quantized(f"{name}.{matches[0]}", params[matches[0]].detach(), d, scale_mode, activations))
    return out


def _quantized(param: str, weight: torch.Tensor, d: Decision, scale_mode: str, activations: str) -> QuantizedWeight:
    if d.fmt not in EXPORTED_FORMATS:
        raise ValueError(f"autoprec.export: {param!r} runs {d.fmt}, which the checkpoint formats cannot say")
    amax = d.input_amax[0] if d.input_amax else None
    if d.fmt == "nvfp4" and activations == "plan" and amax is None:
        raise ValueError(
            f"autoprec.export: {param.removesuffix('.weight')!r} runs NVFP4 with a dynamic activation tensor scale "
            f"(each batch's own amax), which a checkpoint cannot say: its formats carry one static input global "
            f"scale. Compile with options={{'activation_scale': 'static'}} (the RL phases' default), or export "
            f"weights only (activations='none')")
    parts = [quantize(w, d.fmt, 1, tile2d=d.tile2d, scale_mode=scale_mode) for w in (
        weight.unbind(0) if weight.ndim == 3 else [weight])]
    scales = [q.scales.repeat_interleave(16, dim=0) if q.tile_rows == 16 else q.scales for q in parts]
    s_dec = None if parts[0].tensor_scale is None else torch.stack([q.tensor_scale for q in parts])

    def joined(ts: list[torch.Tensor]) -> torch.Tensor:
        return (torch.stack(ts) if weight.ndim == 3 else ts[0]).contiguous()

    return QuantizedWeight(param, d.fmt, joined([q.codes for q in parts]), joined(scales),
                           None if s_dec is None else (s_dec if weight.ndim == 3 else s_dec[0]),
                           activations == "plan", amax, parts[0].tile_rows if d.fmt == "fp8_block" else 1)
