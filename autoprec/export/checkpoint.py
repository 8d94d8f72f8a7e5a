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
    owners: dict[tuple, list[str]] = {}  # tied weights share storage and shape
    for name, t in state.items():
        owners.setdefault((t.data_ptr(), tuple(t.shape)), []).append(name)
    plain, untied = {}, []
    for names in owners.values():
        rest = [n for n in names if n not in quantized]
        if rest:
            plain[rest[0]] = state[rest[0]].detach().cpu().contiguous().clone()
        if len(names) > 1:
            untied += [quantized[n].module for n in names if n in quantized]
    tensors = checkpoint_names(model, plain)
    schemes: dict[tuple[str, bool], list[QuantizedWeight]] = {}
    for q in ep.weights:
        schemes.setdefault((q.scheme, q.activations), []).append(q)
    modules: dict[str, tuple[str, bool]] = {}
    for scheme, weights in schemes.items():  # one renaming per scheme and part: the modules of its keys take it
        parts: dict[str, dict[str, torch.Tensor]] = {}
        for q in weights:
            for suffix, value in write(q).items():
                parts.setdefault(suffix, {})[q.param] = _spread(q, value) if suffix in formats.SCALARS else value
        for suffix, values in parts.items():
            shape = formats.SCALARS.get(suffix)
            for module, piece in _by_module(model, values).items():
                tensors[f"{module}.{suffix}"] = piece.reshape(-1)[:1].reshape(shape) if shape is not None else piece
                modules[module] = scheme
    kept = list(_by_module(model, {f"{name}.weight": state[f"{name}.weight"] for name in ep.kept}))
    return Checkpoint(tensors, modules, kept, untied)


def _spread(q: QuantizedWeight, value: torch.Tensor) -> torch.Tensor:
    """A per-module scalar of ``q`` (one per expert) spread over its weight's rows, so that the checkpoint's splits
    of the weight carry it to every module they make."""
    rows = q.codes.shape[:-1] + (1,)
    return value.reshape(value.shape + (1,) * (len(rows) - value.ndim)).expand(rows)


def _by_module(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` (parts of weight parameters, by the parameters' names in ``model``) split and named as the
    checkpoint splits and names the weights, by checkpoint module name."""
    out = {}
    for key, piece in checkpoint_names(model, weights).items():
        if not key.endswith(".weight"):
            raise ValueError(f"autoprec.export: a planned weight is written as {key!r} in the model's checkpoints, "
                             f"not as a module's weight")
        out[key.removesuffix(".weight")] = piece
    return out


def checkpoint_names(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` (named as ``model`` holds them) under the names and layouts of the model's checkpoints."""
    from transformers import PreTrainedModel
    from transformers.core_model_loading import revert_weight_conversion

    if not isinstance(model, PreTrainedModel):
        return dict(tensors)
    return {k: v.contiguous() for k, v in revert_weight_conversion(model, dict(tensors)).items()}
