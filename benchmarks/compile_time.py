"""First-call (compile + forward + backward) time of autoprec against aot_eager and inductor.

    OMP_NUM_THREADS=1 python benchmarks/compile_time.py [--layers 12] [--d 128] [--ctx 64]

Each backend starts from a fresh dynamo cache on the same 12-layer GPT. Three calls are timed: the
first compiles; with recipe ``auto`` it also calibrates, and the second call compiles the rewritten
graphs; the third is a steady step. "per block" rows compile each block on its own (regional compilation,
as torchtitan does; the embeddings and the head run eagerly): dynamo traces the block once, autoprec plans
and rewrites each block's graph (AOTAutograd's joint trace and its passes), and the min-cut partition and the
inner compiler (inductor's) run once per kind of block: blocks planned alike rewrite to the same graph.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # a cold first call for every backend
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")

import torch

from gpt_model import TinyGPT, tokens


def call_times(backend: str, options: dict | None, regional: bool, args) -> list[float]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyGPT(vocab=256, d=args.d, layers=args.layers, heads=4, ctx=args.ctx)
    if regional:  # torchtitan's way: each block compiled alone, the embeddings and head eager
        for block in model.blocks:
            block.compile(backend=backend, options=options)
        compiled = model
    else:
        compiled = torch.compile(model, backend=backend, options=options)
    idx, tgt = tokens(batch=4, ctx=args.ctx, vocab=256)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        compiled(idx, tgt).backward()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--ctx", type=int, default=64)
    args = parser.parse_args()
    runs = [
        ("aot_eager", "aot_eager", None, False),
        ("inductor", "inductor", None, False),
        ("autoprec nvfp4", "autoprec", {"recipe": "nvfp4"}, False),
        ("autoprec auto", "autoprec", {"recipe": "auto"}, False),
        ("autoprec mxfp8 + inductor", "autoprec", {"recipe": "mxfp8", "inner": "inductor"}, False),
        ("inductor, per block", "inductor", None, True),
        ("autoprec auto, per block", "autoprec", {"recipe": "auto"}, True),
        ("autoprec mxfp8 + ind., per block", "autoprec", {"recipe": "mxfp8", "inner": "inductor"}, True),
        ("autoprec nvidia + ind., per block", "autoprec", {"recipe": "nvfp4_nvidia", "inner": "inductor"}, True),
    ]
    print(f"GPT {args.layers} layers, d={args.d}, ctx={args.ctx}, batch 4; torch {torch.__version__}")
    print(f"{'backend':<34}{'call 1 s':>10}{'call 2 s':>10}{'call 3 s':>10}{'(1+2) / aot_eager':>19}")
    base = None
    for name, backend, options, regional in runs:
        t = call_times(backend, options, regional, args)
        base = base or t[0] + t[1]
        print(f"{name:<34}{t[0]:>10.2f}{t[1]:>10.2f}{t[2]:>10.3f}{(t[0] + t[1]) / base:>19.2f}")


if __name__ == "__main__":
    main()
