"""On-policy check on real rollouts: per model and sampler recipe, how far the trainer's log-probs of the sampled
tokens are from the sampler's (the matched rl_trainer scoring the finished sequences three ways), with two
contrasts: the sampler and trainer under dynamic NVFP4 activation scales (batch-wide amaxes, what the RL phases
used before static scales) and an unmatched BF16 trainer.

    OMP_NUM_THREADS=1 python benchmarks/rl_mismatch.py [--quick]

The sampler generates 8 rollouts of 24 tokens from left-padded prompts with a KV cache (``examples/rollouts.py``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from rollouts import MODELS, Mismatch, compile_sampler, compile_trainer, packings, prompts, sample, score, tiny_model  # noqa: E402

RECIPES = ("bf16", "mxfp8", "nvfp4", "nvfp4_nvidia", "auto")


def rows(kind: str, recipe: str, batch: int, new_tokens: int) -> list[tuple[str, Mismatch]]:
    policy = tiny_model(kind)
    ids, mask = prompts(batch, max_len=8, vocab=256)
    out = []
    for label, options in (("static (default)", {}), ("dynamic", {"activation_scale": "dynamic"})):
        if label == "dynamic" and recipe in ("bf16", "mxfp8"):
            continue  # no tensor scale
        torch._dynamo.reset()
        sampler = compile_sampler(policy, recipe, **options)
        r = sample(sampler, ids, mask, new_tokens)
        trainer = compile_trainer(policy, sampler, **options)
        for packing, logprobs in packings(trainer, r).items():
            out.append((f"rl_trainer, {label} scales, {packing}", Mismatch.of(logprobs, r.logprobs)))
        if label.startswith("static"):
            torch._dynamo.reset()
            out.append(("unmatched BF16 trainer, full batch", Mismatch.of(score_bf16(policy, r), r.logprobs)))
    return out


def score_bf16(policy: torch.nn.Module, r) -> torch.Tensor:
    return score(compile_trainer(policy, None), r)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="llama only, nvfp4 and mxfp8, 4 rollouts of 8 tokens")
    args = parser.parse_args()
    models, recipes = (("llama",), ("mxfp8", "nvfp4")) if args.quick else (MODELS, RECIPES)
    batch, new_tokens = (4, 8) if args.quick else (8, 24)
    print(f"{'model':10} {'sampler recipe':14} {'trainer':58} {'max|dlogp|':>10} {'mean|dp|':>9} {'identical':>9}")
    for kind in models:
        for recipe in recipes:
            for label, m in rows(kind, recipe, batch, new_tokens):
                print(f"{kind:10} {recipe:14} {label:58} {m.max_abs_dlogp:10.3g} {m.mean_abs_dp:9.3g} "
                      f"{m.identical:9.0%}", flush=True)


if __name__ == "__main__":
    main()
