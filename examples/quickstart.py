"""Compile a small GPT with the autoprec backend, train a few steps and print its precision plan.

    OMP_NUM_THREADS=1 python examples/quickstart.py [--recipe auto] [--budget 0.01]

With the default recipe ``auto`` the first step calibrates in high precision, then the plan is fixed.
"""
from __future__ import annotations

import argparse

import torch

import autoprec
from autoprec.planner.options import RECIPES

from gpt_model import TinyGPT, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="auto", choices=list(RECIPES))
    parser.add_argument("--budget", type=float, default=0.01, help="mean damage per GEMM (recipe auto)")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = TinyGPT(vocab=64, d=64, layers=2, heads=2, ctx=32)
    compiled = torch.compile(model, backend="autoprec", options={"recipe": args.recipe, "budget": args.budget})
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    idx, tgt = tokens(batch=8, ctx=32, vocab=64)
    for step in range(args.steps):
        loss = compiled(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step}: loss {loss.item():.4f}")
    print(autoprec.plan(compiled))


if __name__ == "__main__":
    main()
