"""Sampler speed on CPU emulation: milliseconds per decode step of ``generate`` for a 4-layer d=512 Llama sampling
8 rollouts, eager fp32 against the sampler compiled in phase ``rl_sampler`` with each recipe, as ratios from one
run (this machine is shared and noisy).

    OMP_NUM_THREADS=1 python benchmarks/rl_decode.py [--quick] [--inner inductor]

A decode step multiplies 8 rows by every weight; the time per step is (time for 1 + N new tokens - time for 1) / N,
after a warm-up generate that compiles the graphs and fixes the plan.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from rollouts import compile_sampler, prompts, tiny_model  # noqa: E402

RECIPES = ("bf16", "nvfp4", "mxfp8")


def generate_seconds(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, pad_token_id=0)
    return time.perf_counter() - start


def ms_per_step(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, steps: int, repeats: int) -> float:
    generate_seconds(model, ids, mask, steps + 1)  # compiles (and calibrates) every graph
    best = min(generate_seconds(model, ids, mask, steps + 1) - generate_seconds(model, ids, mask, 1)
               for _ in range(repeats))
    return 1e3 * best / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="d=128, 8 steps, one repeat")
    parser.add_argument("--inner", default="aot_eager", choices=("aot_eager", "inductor"),
                        help="autoprec's inner compiler for the sampler")
    args = parser.parse_args()
    hidden, steps, repeats = (128, 8, 1) if args.quick else (512, 16, 3)
    policy = tiny_model("llama", vocab=1024, hidden=hidden, layers=4)
    ids, mask = prompts(batch=8, max_len=16, vocab=1024)
    eager = ms_per_step(policy, ids, mask, steps, repeats)
    print(f"4-layer d={hidden} Llama, 8 rollouts, inner {args.inner}: ms per decode step (ratio to eager fp32)")
    print(f"{'eager fp32':24} {eager:8.1f} ms  1.00x", flush=True)
    for recipe in RECIPES:
        torch._dynamo.reset()
        ms = ms_per_step(compile_sampler(policy, recipe, inner=args.inner), ids, mask, steps, repeats)
        print(f"{recipe + ' plan':24} {ms:8.1f} ms  {ms / eager:.2f}x", flush=True)


if __name__ == "__main__":
    main()
