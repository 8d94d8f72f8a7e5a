"""CPU cost of emulating low precision: step time of the all-NVFP4 plan over the BF16 plan.

    OMP_NUM_THREADS=1 python benchmarks/emulation_overhead.py [--layers 2] [--d 64] [--ctx 64] [--steps 10]

All plans run the same rewritten graphs (quantize + scaled_mm custom ops); BF16 only casts its
operands, MXFP8 / NVFP4 quantize them bit-exactly with the fused C kernels (kernels/cpu/fused.py; the
default on CPU). AUTOPREC_KERNELS=ref_inductor (the reference compiled by inductor) or =ref (eager
reference) time the older paths. The auto row times calibration steps (``calibrate`` = warmup + steps,
so every timed step measures). The models take turns step by step, so load drifts on a shared machine
affect every ratio alike. For context it also times plain eager and torchao's emulated MXFP8
training recipe (``MXFP8TrainingOpConfig``, kernel_preference EMULATED: MXFP8 fprop, dgrad and wgrad of
every Linear) on the same model, or says why it cannot run.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import torch

from gpt_model import TinyGPT, tokens


def step_seconds(models: dict[str, torch.nn.Module], args) -> dict[str, float]:
    """Median training-step time of each model. The models take turns step by step (after ``warmup``
    steps each), so the machine's load drifts affect every ratio alike."""
    idx, tgt = tokens(batch=args.batch, ctx=args.ctx, vocab=256)
    times: dict[str, list[float]] = {name: [] for name in models}
    for i in range(args.warmup + args.steps):
        for name, model in models.items():
            start = time.perf_counter()
            model(idx, tgt).backward()
            if i >= args.warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def torchao_mxfp8(base: TinyGPT):
    """torchao's emulated MXFP8 training recipe on a copy of the model, or why it cannot run."""
    try:
        from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
        from torchao.quantization import quantize_

        model = copy.deepcopy(base)
        quantize_(model, MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL))
        return model, None
    except Exception as exc:  # a missing package or an unsupported CPU path: reported, not fatal
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--ctx", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    base = TinyGPT(vocab=256, d=args.d, layers=args.layers, heads=4, ctx=args.ctx)
    models = {"eager fp32": copy.deepcopy(base)}
    for recipe in ("bf16", "mxfp8", "nvfp4", "nvfp4_nvidia"):
        models[f"autoprec {recipe}"] = torch.compile(copy.deepcopy(base), backend="autoprec",
                                                     options={"recipe": recipe})
    models["autoprec auto (calibrating)"] = torch.compile(
        copy.deepcopy(base), backend="autoprec", options={"recipe": "auto", "calibrate": args.warmup + args.steps + 1})
    model, why_not = torchao_mxfp8(base)
    if model is not None:
        try:
            model(*tokens(batch=args.batch, ctx=args.ctx, vocab=256)).backward()
            models["torchao MXFP8 emulated"] = model
        except Exception as exc:
            why_not = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    rows = list(step_seconds(models, args).items())
    table = dict(rows)
    bf16 = table["autoprec bf16"]
    print(f"GPT {args.layers} layers, d={args.d}, ctx={args.ctx}, batch {args.batch}; median of {args.steps} steps; "
          f"AUTOPREC_KERNELS={os.environ.get('AUTOPREC_KERNELS', 'auto')}")
    print(f"{'path':<28}{'s/step':>10}{'x autoprec bf16':>17}")
    for name, sec in rows:
        print(f"{name:<28}{sec:>10.4f}{sec / bf16:>17.2f}")
    print(f"NVFP4 plan / BF16 plan: {table['autoprec nvfp4'] / bf16:.2f}x (target <= 1.5x); "
          f"MXFP8: {table['autoprec mxfp8'] / bf16:.2f}x (target <= 1.3x); "
          f"auto calibration step: {table['autoprec auto (calibrating)'] / bf16:.2f}x (target <= 3x)")
    if why_not:
        print(f"torchao MXFP8 did not run here: {why_not}")


if __name__ == "__main__":
    main()
