"""Train a nanoGPT-style byte-level GPT on the Python stdlib's sources with backend="autoprec".

    OMP_NUM_THREADS=1 python examples/train_gpt.py [--recipe auto] [--steps 200] [--layers 4] [--d 128]

Prints the loss as it trains, the validation loss at the end and the precision plan autoprec chose.
"""
from __future__ import annotations

import argparse
import time

import torch

import autoprec
from autoprec.planner.options import RECIPES

from corpus import Batches, split, stdlib_bytes
from gpt_model import TinyGPT


def evaluate(model, data: torch.Tensor, ctx: int, batch: int, batches: int = 8) -> float:
    """Mean loss on fixed validation windows, through the training graph (its plan's numerics; under
    no_grad dynamo would compile a separate inference graph with a plan of its own)."""
    stream = Batches(data, ctx, batch, seed=1234)
    return sum(model(*stream.next()).item() for _ in range(batches)) / batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="auto", choices=list(RECIPES))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--ctx", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    train, val = split(stdlib_bytes())
    torch.manual_seed(args.seed)
    model = TinyGPT(vocab=256, d=args.d, layers=args.layers, heads=4, ctx=args.ctx)
    compiled = torch.compile(model, backend="autoprec", options={"recipe": args.recipe})
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    stream = Batches(train, args.ctx, args.batch, seed=args.seed)
    start = time.perf_counter()
    for step in range(args.steps):
        loss = compiled(*stream.next())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  {time.perf_counter() - start:6.1f}s")
    print(f"validation loss {evaluate(compiled, val, args.ctx, args.batch):.4f}")
    print(autoprec.plan(compiled))


if __name__ == "__main__":
    main()
