"""The two checkpoint conventions: the quantization config and the tensors each writes for a quantized Linear.

compressed-tensors (vLLM, SGLang): ``quantization_config`` in config.json, one config group per scheme, NVFP4 as
``weight_packed`` (two E2M1 codes per byte), ``weight_scale`` (E4M3 per 16 values), ``weight_global_scale`` and
``input_global_scale`` (the encoding scales S_enc = 448·6 / amax); MXFP8 as ``weight`` (E4M3) and ``weight_scale``
(E8M0 bytes per 32 values). ModelOpt (TensorRT-LLM, vLLM): ``hf_quant_config.json`` with ``quantized_layers``, NVFP4
as ``weight`` (packed), ``weight_scale``, ``weight_scale_2`` and ``input_scale`` (decoding scales, about
amax / (448·6), chosen so that engines inverting them get autoprec's encoding scales exactly).
"""
from __future__ import annotations

import torch

from .weights import QuantizedWeight

NVFP4_ARGS = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16, "strategy": "tensor_group",
              "dynamic": False, "scale_dtype": "torch.float8_e4m3fn"}
MXFP8_ARGS = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": 32, "strategy": "group",
              "dynamic": False, "scale_dtype": "torch.uint8"}
# FP8-block (DeepSeek-V3's, compressed-tensors' FP8_BLOCK preset): fp32 scales per 128x128 weight tile (strategy
# block) or per 128 values of a weight row (group), the input quantized per 128 values at run time (dynamic group)
FP8_BLOCK_ARGS = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "block", "block_structure": [128, 128],
                  "dynamic": False}
FP8_ROWS_ARGS = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "group", "group_size": 128,
                 "dynamic": False}
FP8_INPUT_ARGS = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "group", "group_size": 128,
                  "dynamic": True}
CT_FORMATS = {"nvfp4": "nvfp4-pack-quantized", "mxfp8": "mxfp8-quantized", "fp8_block": "float-quantized",
              "fp8_block_rows": "float-quantized"}


# per-module scalars, and the shape each format stores them in
SCALARS = {"weight_global_scale": (1,), "input_global_scale": (1,), "weight_scale_2": (), "input_scale": ()}


def ct_group(fmt: str, activations: bool, targets: list[str]) -> dict:
    """One ``config_groups`` entry: the weights' args, the input's (NVFP4: local E4M3 block scales under the static
    global scale; MXFP8: dynamic E8M0 blocks; FP8-block: dynamic fp32 scales per 128 values), or none for weights
    only. ``fmt``: a ``QuantizedWeight.scheme``."""
    if fmt.startswith("fp8_block"):
        weights = dict(FP8_BLOCK_ARGS if fmt == "fp8_block" else FP8_ROWS_ARGS)
        return {"targets": targets, "weights": weights, "input_activations": dict(FP8_INPUT_ARGS) if activations
                else None, "output_activations": None, "format": CT_FORMATS[fmt]}
    weights = dict(NVFP4_ARGS if fmt == "nvfp4" else MXFP8_ARGS)
    inputs = None
    if activations:
        inputs = dict(weights, dynamic="local", observer="static_minmax") if fmt == "nvfp4" else dict(
            weights, dynamic=True)
    return {"targets": targets, "weights": weights, "input_activations": inputs, "output_activations": None,
            "format": CT_FORMATS[fmt]}


def ct_config(groups: dict[tuple[str, bool], list[str]], ignore: list[str]) -> dict:
    """config.json's ``quantization_config`` for compressed-tensors: one config group per (format, input
    quantized) with its modules, the unquantized Linears ignored."""
    formats = {CT_FORMATS[fmt] for fmt, _ in groups}
    return {
        "quant_method": "compressed-tensors",
        "format": formats.pop() if len(formats) == 1 else "mixed-precision",
        "quantization_status": "compressed",
        "config_groups": {f"group_{i}": ct_group(fmt, acts, sorted(names))
                          for i, ((fmt, acts), names) in enumerate(sorted(groups.items()))},
        "ignore": sorted(ignore),
        "kv_cache_scheme": None,
    }


def ct_tensors(q: QuantizedWeight) -> dict[str, torch.Tensor]:
    """The tensors compressed-tensors names for ``q``, by their name under the module (``SCALARS`` per expert)."""
    if q.fmt in ("mxfp8", "fp8_block"):
        return {"weight": q.codes, "weight_scale": q.scales}
    out = {"weight_packed": q.codes, "weight_scale": q.scales.view(torch.float8_e4m3fn),
           "weight_global_scale": 1 / q.s_dec}
    if q.activations:
        out["input_global_scale"] = q.input_global_scale().reshape(()).expand(q.s_dec.shape)
    return out


def modelopt_config(layers: dict[str, str], exclude: list[str], version: str) -> dict:
    """hf_quant_config.json's content for ModelOpt's mixed-precision export: ``layers`` maps each quantized module
    to its format."""
    algos = {name: {"quant_algo": "NVFP4", "group_size": 16} if fmt == "nvfp4" else {"quant_algo": "MXFP8"}
             for name, fmt in sorted(layers.items())}
    return {
        "producer": {"name": "autoprec", "version": version},
        "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None, "quantized_layers": algos,
                         "exclude_modules": sorted(exclude)},
    }


def modelopt_tensors(q: QuantizedWeight) -> dict[str, torch.Tensor]:
    """The tensors ModelOpt's exporter writes for ``q`` (``SCALARS`` per expert)."""
    if q.fmt == "mxfp8":
        return {"weight": q.codes, "weight_scale": q.scales}
    out = {"weight": q.codes, "weight_scale": q.scales.view(torch.float8_e4m3fn), "weight_scale_2": q.s_dec}
    if q.activations:
        out["input_scale"] = inverse_of(q.input_global_scale()).reshape(()).expand(q.s_dec.shape)
    return out


def inverse_of(target: torch.Tensor) -> torch.Tensor:
    """The fp32 value nearest 1 / ``target`` whose fp32 reciprocal is ``target`` exactly, where one of the three
    nearest is: ModelOpt stores decoding scales, and engines invert them to the encoding scale autoprec uses."""
    x = 1 / target
    for candidate in (x, torch.nextafter(x, torch.full_like(x, float("inf"))), torch.nextafter(x, torch.zeros_like(x))):
        if torch.equal(1 / candidate, target):
            return candidate
    return x
