"""``autoprec.export``: a model's planned forward as a Hugging Face checkpoint that inference engines load
(compressed-tensors for vLLM and SGLang, ModelOpt for TensorRT-LLM and vLLM). See docs/export.md."""
from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import torch

from . import formats
from .checkpoint import Checkpoint, assemble
from .weights import ExportPlan, export_plan

FORMATS = ("compressed-tensors", "modelopt")
ACTIVATIONS = ("plan", "none")


def export(model: torch.nn.Module, directory: str | Path, format: str = "compressed-tensors",
           activations: str = "plan") -> Path:
    """Writes ``model`` (compiled with ``backend="autoprec"`` and called at least once) to ``directory`` as a
    Hugging Face checkpoint in which every Linear and experts projection holds its planned **fprop** format, under
    the names the model's own checkpoints use: config.json (the model's own config with a ``quantization_config``),
    model.safetensors and a README.md saying what the format could not carry. ``activations="none"`` writes weights
    only (the input left unquantized). Raises ``ValueError``, naming the module, where the plan cannot be written
    faithfully."""
    if format not in FORMATS:
        raise ValueError(f"autoprec.export: format {format!r} is not one of {', '.join(FORMATS)}")
    if activations not in ACTIVATIONS:
        raise ValueError(f"autoprec.export: activations {activations!r} is not one of {', '.join(ACTIVATIONS)}")
    if format == "modelopt" and activations != "plan":
        raise ValueError("autoprec.export: ModelOpt's NVFP4 and MXFP8 quantize the input too; "
                         "export weights only with format='compressed-tensors'")
    ep = export_plan(model, activations)
    fp8 = [q.module for q in ep.weights if q.fmt == "fp8_block"]
    if format == "modelopt" and fp8:
        raise ValueError(f"autoprec.export: {fp8[0]!r} runs fp8_block, which the ModelOpt export does not write (it "
                         f"writes NVFP4 and MXFP8); export it with format='compressed-tensors' (its FP8 block scheme)")
    config = getattr(ep.root, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise ValueError(f"autoprec.export writes Hugging Face checkpoints: this {type(ep.root).__name__} has no "
                         f"transformers config (.config)")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ck = assemble(ep, format)
    config_dict = config.to_dict()
    if ck.untied:
        config_dict["tie_word_embeddings"] = False
    if format == "compressed-tensors":
        groups: dict[tuple[str, bool], list[str]] = {}
        for module, scheme in ck.modules.items():
            groups.setdefault(scheme, []).append(module)
        config_dict["quantization_config"] = formats.ct_config(groups, ck.kept)
    else:
        layers = {module: fmt for module, (fmt, _) in ck.modules.items()}
        hf_quant = formats.modelopt_config(layers, ck.kept, version("autoprec"))
        (out / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=2) + "\n")
        config_dict["quantization_config"] = {"quant_method": "modelopt", **hf_quant["quantization"]}
    (out / "config.json").write_text(json.dumps(config_dict, indent=2, default=str) + "\n")
    from safetensors.torch import save_file

    save_file(ck.tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "README.md").write_text(_note(ep, ck, format))
    return out


def _note(ep: ExportPlan, ck: Checkpoint, format: str) -> str:
    """The directory's README: what the checkpoint holds and what its format cannot say."""
    counts: dict[str, int] = {}
    for fmt, _ in ck.modules.values():
        counts[fmt] = counts.get(fmt, 0) + 1
    held = ", ".join(f"{n} modules in {fmt.upper()}" for fmt, n in sorted(counts.items())) or "no quantized module"
    lines = [
        f"# autoprec export ({format})", "",
        f"Written by autoprec {version('autoprec')} from the model's plan: {held}; {len(ck.kept)} Linear modules in "
        f"their own dtype (listed as ignored / excluded).", "",
        "What this checkpoint cannot say, and autoprec's plan does:", "",
        "- the backward GEMMs' formats (dgrad, wgrad): checkpoints describe inference, so only each Linear's forward "
        "(fprop) format is here;",
    ]
    if format == "compressed-tensors":
        lines.append("- autoprec's exact dequantization order: autoprec multiplies codes by the block scale and then "
                     "by the tensor's decoding scale; compressed-tensors divides the block scale by the global scale "
                     "(in bf16 when it decompresses), so its weights can differ from autoprec's in the last bits.")
    else:
        lines.append("- NVFP4 input scales are stored inverted (about amax / (448·6)); engines invert them again. "
                     "Each is chosen so that its fp32 reciprocal is autoprec's encoding scale, but about one fp32 "
                     "value in nine is no fp32 number's reciprocal: such a scale comes back one unit in the last "
                     "place off.")
    if any(q.fmt == "fp8_block" for q in ep.weights) and any(q.activations for q in ep.weights):
        lines.append("- FP8-block inputs are quantized by the engine at run time, per 128 values, with its own scale "
                     "rule (engines divide by amax / 448; autoprec's scales are that factor's power of two), so "
                     "engine activations can differ from autoprec's sampler in the last bits.")
    if ck.untied:
        lines.append(f"- {', '.join(ck.untied)} shared its weight with another module; it is quantized here, so the "
                     f"config unties them (tie_word_embeddings false) and the other module keeps the weight as it is.")
    lines += [f"- {note}" for note in ep.notes]
    return "\n".join(lines) + "\n"


__all__ = ["export"]
