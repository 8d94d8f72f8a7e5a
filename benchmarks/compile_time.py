"""First-call (compile + forward + backward) time of autoprec against aot_eager and inductor.

    OMP_NUM_THREADS=1 python benchmarks/compile_time.py [--layers 12] [--d 128] [--ctx 64]

Each backend starts from a fresh dynamo cache on the same 12-layer GPT; the second call's time is
printed too, so compile time and run time can be told apart.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import torch

from gpt_model import TinyGPT, tokens


def first_and_second_call(backend: str, options: dict | None, args) -> tuple[float, float]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyGPT(vocab=256, d=args.d, layers=args.layers, heads=4, ctx=args.ctx)
    compiled = torch.compile(model, backend=backend, options=options)
    idx, tgt = tokens(batch=4, ctx=args.ctx, vocab=256)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        compiled(idx, tgt).backward()
        times.append(time.perf_counter() - start)
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--ctx", type=int, default=64)
    args = parser.parse_args()
    runs = [
        ("aot_eager", "aot_eager", None),
        ("inductor", "inductor", None),
        ("autoprec nvfp4", "autoprec", {"recipe": "nvfp4"}),
        ("autoprec mxfp8 + inductor", "autoprec", {"recipe": "mxfp8", "inner": "inductor"}),
    ]
    print(f"GPT {args.layers} layers, d={args.d}, ctx={args.ctx}, batch 4; torch {torch.__version__}")
    print(f"{'backend':<28}{'first call s':>14}{'second call s':>15}{'first / aot_eager':>19}")
    base = None
    for name, backend, options in runs:
        first, second = first_and_second_call(backend, options, args)
        base = base or first
        print(f"{name:<28}{first:>14.2f}{second:>15.3f}{first / base:>19.2f}")


if __name__ == "__main__":
    main()
