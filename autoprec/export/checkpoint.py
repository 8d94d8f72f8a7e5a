"""A checkpoint's tensors under the names the Hugging Face model's own checkpoints use: transformers' models may
hold weights otherwise than their checkpoints name them (experts fused into one 3D parameter per projection,
modules renamed), and engines read the checkpoints' names. transformers' own ``revert_weight_conversion`` (what
``save_pretrained`` writes with) maps each tensor, quantized parts included, one by one."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import formats
from .weights import ExportPlan, QuantizedWeight


@dataclass
class Checkpoint:
    """The tensors to write, each quantized module (by its checkpoint name) with its (format, input quantized),
    the unquantized Linears' checkpoint names, and the quantized weights untied from a module they shared them with."""

    tensors: dict[str, torch.Tensor]
    modules: dict[str, tuple[str, bool]]
    kept: list[str]
    untied: list[str]


def assemble(ep: ExportPlan, format: str) -> Checkpoint:
    """``ep`` as the tensors of a ``format`` checkpoint. A tied weight that is not quantized is written once (the
    model ties it again on load); a quantized one is written quantized, the module it was tied to keeps the weight
    as it is, and the config must untie them."""
    model, write = ep.root, formats.ct_tensors if format == "compressed-tensors" else formats.modelopt_tensors
    quantized = {q.param: q for q in ep.weights}
    state = model.state_dict()
    owners: dict[tuple, list[str]] = {}
    for name, t in state.items():
        owners.setdefault((t.data_ptr(), tuple(t.shape)), []).append(name)
    untied = [quantized[n].module for names in owners.values() if len(names) > 1 for n in names if n in quantized]
    plain, written = {}, set()
    for name, t in state.items():
        key = (t.data_ptr(), tuple(t.shape))
        if name not in quantized and key not in written:
            written.add(key)
            plain[name] = t.detach().cpu().contiguous().clone()
    tensors = checkpoint_names(model, plain)
    modules: dict[str, tuple[str, bool]] = {}
    for q in ep.weights:
        for suffix, value in write(q).items():
            for module, piece in _named_parts(model, q, value, suffix in formats.SCALARS).items():
                shape = formats.SCALARS.get(suffix)
                tensors[f"{module}.{suffix}"] = piece.reshape(-1)[:1].reshape(shape) if shape is not None else piece
                modules[module] = (q.fmt, q.activations)
    kept = [module for name in ep.kept
            for module in _named_parts(model, None, state[f"{name}.weight"], False, f"{name}.weight")]
    return Checkpoint(tensors, modules, kept, untied)


def _named_parts(model: torch.nn.Module, q: QuantizedWeight | None, value: torch.Tensor, scalar: bool,
                 param: str | None = None) -> dict[str, torch.Tensor]:
    """``value`` (a part of ``q``'s weight, or a per-module scalar: one per expert) split as the checkpoint
    splits the weight, by checkpoint module name."""
    param = param or q.param
    if scalar:  # spread over the weight's rows, so the checkpoint's splits carry it to every module
        rows = q.codes.shape[:-1] + (1,)
        value = value.reshape(value.shape + (1,) * (len(rows) - value.ndim)).expand(rows)
    out = {}
    for key, piece in checkpoint_names(model, {param: value}).items():
        if not key.endswith(".weight"):
            raise ValueError(f"autoprec.export: {param!r} is written as {key!r} in the model's checkpoints, not as a "
                             f"module's weight")
        out[key.removesuffix(".weight")] = piece.contiguous()
    return out


def checkpoint_names(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` (named as ``model`` holds them) under the names and layouts of the model's checkpoints."""
    from transformers import PreTrainedModel
    from transformers.core_model_loading import revert_weight_conversion

    if not isinstance(model, PreTrainedModel):
        return dict(tensors)
    return {k: v.contiguous() for k, v in revert_weight_conversion(model, dict(tensors)).items()}
