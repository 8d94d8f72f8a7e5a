"""Plan an RL sampler, export its forward as compressed-tensors and ModelOpt checkpoints, load them back and
compare with what autoprec runs.

    OMP_NUM_THREADS=1 python examples/export_sampler.py [--model llama] [--recipe nvfp4] [--out export_out]

The sampler runs in phase ``rl_sampler`` (static NVFP4 activation scales, which the checkpoints carry). The
compressed-tensors directory is loaded by ``transformers.AutoModelForCausalLM.from_pretrained`` (decompressed:
a CPU has no FP4 kernels), the ModelOpt one converted by compressed-tensors' ModelOpt NVFP4 converter.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from rollouts import compile_sampler, prompts, sample, tiny_model

import autoprec
from autoprec.export.weights import export_plan


def weight_differences(sampler: torch.nn.Module, loaded: torch.nn.Module) -> tuple[int, float, float]:
    """How transformers' decompressed weights compare with autoprec's dequantized ones: (quantized weights, the
    share of elements equal to autoprec's rounded to bf16, the largest relative difference). compressed-tensors
    decompresses in bf16, dividing each block scale by the global scale where autoprec multiplies by S_dec."""
    linears = export_plan(sampler, "plan").weights
    modules = dict(loaded.named_modules())
    equal = total = 0
    worst = 0.0
    for q in linears:
        mine = q.weight_values()
        theirs = modules[q.module].weight.detach()
        equal += int((mine.bfloat16() == theirs.bfloat16()).sum())
        total += mine.numel()
        worst = max(worst, float(((theirs.float() - mine).abs() / mine.abs().clamp_min(1e-30)).max()))
    return len(linears), equal / total, worst


def modelopt_against_compressed_tensors(out: Path) -> tuple[dict, dict, list[str]]:
    """The ModelOpt export under ``out`` converted by compressed-tensors' ModelOpt NVFP4 converter, the
    compressed-tensors export beside it, and the names of the latter's tensors the conversion does not give bit for
    bit (fp8 compared by its bytes, a 0-d scale like its [1] form)."""
    import json

    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import ModelOptNvfp4Converter
    from safetensors.torch import load_file

    layers = json.loads((out / "modelopt" / "hf_quant_config.json").read_text())["quantization"]["quantized_layers"]
    nvfp4 = [name for name, spec in layers.items() if spec["quant_algo"] == "NVFP4"]
    converted = ModelOptNvfp4Converter(targets=nvfp4).process(load_file(out / "modelopt" / "model.safetensors"))
    reference = load_file(out / "compressed-tensors" / "model.safetensors")

    def bits(t: torch.Tensor) -> torch.Tensor:
        return (t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t).reshape(-1)

    differ = sorted(k for k in reference
                    if k not in converted or not torch.equal(bits(converted[k]), bits(reference[k])))
    return converted, reference, differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama", choices=("llama", "gpt2"))
    parser.add_argument("--recipe", default="nvfp4")
    parser.add_argument("--out", default="export_out")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    policy = tiny_model(args.model)
    sampler = compile_sampler(policy, args.recipe)
    ids, mask = prompts(batch=4, max_len=6, vocab=policy.config.vocab_size)
    sample(sampler, ids, mask, new_tokens=4)  # the first call fixes the sampler's plan
    out = Path(args.out)
    for fmt in ("compressed-tensors", "modelopt"):
        path = autoprec.export(sampler, out / fmt, format=fmt)
        print(f"{fmt}: {path} ({', '.join(sorted(p.name for p in path.iterdir()))})")

    loaded = AutoModelForCausalLM.from_pretrained(out / "compressed-tensors",
                                                  quantization_config=CompressedTensorsConfig(dequantize=True))
    n, share, worst = weight_differences(sampler, loaded)
    print(f"compressed-tensors, loaded by transformers: {n} quantized weights, {100 * share:.2f}% of their elements "
          f"equal autoprec's rounded to bf16, largest relative difference {worst:.2e}")
    _, reference, differ = modelopt_against_compressed_tensors(out)
    print(f"modelopt, converted by compressed-tensors: {len(reference) - len(differ)} tensors bit-identical to the "
          f"compressed-tensors export; "
          f"not: {', '.join(differ) or 'none'}")
    with torch.no_grad():
        mine = sampler(ids, attention_mask=mask).logits.float()
        theirs = loaded(ids, attention_mask=mask).logits.float()
    print(f"logits, transformers on the decompressed weights (activations unquantized) against the sampler: "
          f"max |difference| {float((mine - theirs).abs().max()):.3e} (logits up to {float(mine.abs().max()):.1f})")


if __name__ == "__main__":
    main()
