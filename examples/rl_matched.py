"""RL with matched numerics: the trainer's forward reproduces the sampler's logits bit for bit.

    OMP_NUM_THREADS=1 python examples/rl_matched.py

The sampler is compiled for inference (phase ``rl_sampler``); the trainer (phase ``rl_trainer``) copies
the sampler plan's forward decisions, so the policy that generated the samples is exactly the one the
trainer differentiates. A trainer that simply runs in BF16 is off-policy by the printed amount.
"""
from __future__ import annotations

import copy

import torch

import autoprec

from gpt_model import TinyGPT, tokens


def main() -> None:
    torch.manual_seed(0)
    policy = TinyGPT(vocab=64, d=64, layers=2, heads=2, ctx=32)
    idx, _ = tokens(batch=8, ctx=32, vocab=64)

    sampler = torch.compile(copy.deepcopy(policy), backend="autoprec", options={"phase": "rl_sampler"})
    with torch.no_grad():
        sampler(idx)  # the first call calibrates, then the sampler's plan is fixed
        sampled = sampler(idx)
    sampler_plan = autoprec.plan(sampler)
    print(sampler_plan.summary())

    trainer = torch.compile(copy.deepcopy(policy), backend="autoprec",
                            options={"phase": "rl_trainer", "match": sampler_plan})
    bf16_trainer = torch.compile(copy.deepcopy(policy), backend="autoprec", options={"recipe": "bf16"})
    matched = trainer(idx)
    matched.float().logsumexp(-1).mean().backward()  # a training step runs through the same graph
    mismatched = bf16_trainer(idx)
    print(f"max |logit difference| sampler vs rl_trainer:   {(matched.detach() - sampled).abs().max().item():.3e}")
    print(f"max |logit difference| sampler vs BF16 trainer: {(mismatched.detach() - sampled).abs().max().item():.3e}")


if __name__ == "__main__":
    main()
