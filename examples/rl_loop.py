"""An on-policy RL loop by hand: a sampler and a trainer, the trainer's weights copied into the sampler after every
update, and the mismatch between the two on the sampled tokens printed per step.

    OMP_NUM_THREADS=1 python examples/rl_loop.py [--steps 4] [--recipe nvfp4] [--model llama]

The sampler is compiled in phase ``rl_sampler`` (NVFP4 with static activation scales: a batch-invariant forward),
the trainer in ``rl_trainer`` with the sampler's plan, so its forward reproduces the sampler's numerics. Each step
samples 8 rollouts with a KV cache, scores them with the trainer in training mode, takes a REINFORCE step on a toy
reward (tokens from the lower half of the vocabulary), and copies the new weights into the sampler with
``load_state_dict``, which the sampler's prepared weights see (docs/rl.md).
"""
from __future__ import annotations

import argparse

import torch
from rollouts import MODELS, Mismatch, compile_sampler, compile_trainer, prompts, sample, score, tiny_model


def reward(completions: torch.Tensor, vocab: int) -> torch.Tensor:
    return (completions < vocab // 2).float().mean(-1)


def run(steps: int, recipe: str, kind: str = "llama", vocab: int = 256) -> list[tuple[Mismatch, float]]:
    """``steps`` on-policy steps; returns each step's (trainer vs sampler mismatch, mean reward)."""
    policy = tiny_model(kind, vocab=vocab)
    sampler = compile_sampler(policy, recipe)
    ids, mask = prompts(batch=8, max_len=8, vocab=vocab)
    sample(sampler, ids, mask, new_tokens=2)  # the first call fixes the sampler's plan
    trainer = compile_trainer(policy, sampler)
    opt = torch.optim.AdamW(trainer.parameters(), lr=3e-3)
    history = []
    for step in range(steps):
        rollouts = sample(sampler, ids, mask, new_tokens=16, seed=step)
        logprobs = score(trainer, rollouts)
        r = reward(rollouts.completions, vocab)
        history.append((Mismatch.of(logprobs, rollouts.logprobs), float(r.mean())))
        loss = -((r - r.mean())[:, None] * logprobs).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sampler.load_state_dict(trainer.state_dict())  # weight sync: the sampler runs the new policy
    return history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--recipe", default="nvfp4")
    parser.add_argument("--model", default="llama", choices=MODELS)
    args = parser.parse_args()
    for step, (m, r) in enumerate(run(args.steps, args.recipe, args.model)):
        print(f"step {step}: mean reward {r:.3f}; trainer vs sampler on the sampled tokens: max |d log p| "
              f"{m.max_abs_dlogp:.3g}, {m.identical:.0%} bit-identical")


if __name__ == "__main__":
    main()
