"""``autoprec.export``: a model's planned forward as a Hugging Face checkpoint that inference engines load
(compressed-tensors for vLLM and SGLang, ModelOpt for TensorRT-LLM and vLLM). See docs/export.md."""
from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import torch

from . import formats
from .weights import ExportPlan, export_plan

FORMATS = ("compressed-tensors", "modelopt")
ACTIVATIONS = ("plan", "none")


def export(model: torch.nn.Module, directory: str | Path, format: str = "compressed-tensors",
           activations: str = "plan") -> Path:
    """Writes ``model`` (compiled with ``backend="autoprec"`` and called at least once) to ``directory`` as a
    Hugging Face checkpoint in which every Linear holds its planned **fprop** format: config.json (the model's
    own config with a ``quantization_config``), model.safetensors and a README.md saying what the format could not
    carry. ``activations="none"`` writes weights only (the input left unquantized). Raises ``ValueError``, naming the
    module, where the plan cannot be written faithfully."""
    if format not in FORMATS:
        raise ValueError(f"autoprec.export: format {format!r} is not one of {', '.join(FORMATS)}")
    if activations not in ACTIVATIONS:
        raise ValueError(f"autoprec.export: activations {activations!r} is not one of {', '.join(ACTIVATIONS)}")
    if format == "modelopt" and activations != "plan":
        raise ValueError("autoprec.export: ModelOpt's NVFP4 and MXFP8 quantize the input too; "
                         "export weights only with format='compressed-tensors'")
    ep = export_plan(model, activations)
    config = getattr(ep.root, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise ValueError(f"autoprec.export writes Hugging Face checkpoints: this {type(ep.root).__name__} has no "
                         f"transformers config (.config)")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors, untied = _tensors(ep, format)
    config_dict = config.to_dict()
    if untied:
        config_dict["tie_word_embeddings"] = False
    if format == "compressed-tensors":
        config_dict["quantization_config"] = formats.ct_config(ep.linears, ep.kept)
    else:
        hf_quant = formats.modelopt_config(ep.linears, ep.kept, version("autoprec"))
        (out / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=2) + "\n")
        config_dict["quantization_config"] = {"quant_method": "modelopt", **hf_quant["quantization"]}
    (out / "config.json").write_text(json.dumps(config_dict, indent=2, default=str) + "\n")
    from safetensors.torch import save_file

    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "README.md").write_text(_note(ep, format, untied))
    return out


def _tensors(ep: ExportPlan, format: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Every tensor of the checkpoint, and the quantized Linears whose weight was tied to another module's: those
    are written quantized and the other module's weight as it is (the config then unties them). A tied weight
    that is not quantized is written once; the model ties it again on load."""
    write = formats.ct_tensors if format == "compressed-tensors" else formats.modelopt_tensors
    quantized = {f"{q.name}.weight": q for q in ep.linears}
    state = ep.root.state_dict()
    owners: dict[tuple, list[str]] = {}
    for name, t in state.items():
        owners.setdefault((t.data_ptr(), tuple(t.shape)), []).append(name)
    untied = [quantized[n].name for names in owners.values() if len(names) > 1 for n in names if n in quantized]
    out: dict[str, torch.Tensor] = {}
    written: set[tuple] = set()
    for name, t in state.items():
        if name in quantized:
            q = quantized[name]
            out.update({f"{q.name}.{k}": v.detach().cpu().contiguous() for k, v in write(q).items()})
            continue
        key = (t.data_ptr(), tuple(t.shape))
        if key not in written:
            written.add(key)
            out[name] = t.detach().cpu().contiguous().clone()
    return out, untied


def _note(ep: ExportPlan, format: str, untied: list[str]) -> str:
    """The directory's README: what the checkpoint holds and what its format cannot say."""
    counts: dict[str, int] = {}
    for q in ep.linears:
        counts[q.fmt] = counts.get(q.fmt, 0) + 1
    held = ", ".join(f"{n} Linear modules in {fmt.upper()}" for fmt, n in sorted(counts.items()))
    held = held or "no quantized Linear"
    lines = [
        f"# autoprec export ({format})", "",
        f"Written by autoprec {version('autoprec')} from the model's plan: {held}; {len(ep.kept)} Linear modules in "
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
    if untied:
        lines.append(f"- {', '.join(untied)} shared its weight with another module; it is quantized here, so the "
                     f"config unties them (tie_word_embeddings false) and the other module keeps the weight as it is.")
    lines += [f"- {note}" for note in ep.notes]
    return "\n".join(lines) + "\n"


__all__ = ["export"]
