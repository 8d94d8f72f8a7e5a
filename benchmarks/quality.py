"""Quality vs projected speed: the same GPT trained with each recipe, same seeds and data order.

    OMP_NUM_THREADS=1 python benchmarks/quality.py [--layers 2] [--d 64] [--ctx 64] [--steps 150] [--seeds 2]
                                                   [--moe 8]

Prints per recipe the final validation loss per seed, the paired gap vs bf16 (mean over seeds, in %),
the projected GB300 GEMM speedup and NVFP4 FLOP share from the plan, and CPU seconds per step (the
quantization is emulated on CPU by the fused C kernels, bit-exact with the reference). Writes
benchmarks/out/quality.json, quality_loss.png (loss curves) and quality_formats.png (the per-layer
format map of each recipe). The defaults finish in a few minutes on two cores; --layers 4 --d 128
--ctx 128 --steps 400 is the larger setting. ``--moe E`` replaces each MLP by a top-2 mixture of E experts
(grouped GEMMs, each expert quantized on its own).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import torch
from rich.progress import Progress

import autoprec

from corpus import Batches, split, stdlib_bytes
from gpt_model import TinyGPT

RECIPES = ["bf16", "mxfp8", "nvfp4", "nvfp4_nvidia", "auto"]
ROLES = ["fprop", "dgrad", "wgrad"]
FORMATS = ["bf16", "mxfp8", "nvfp4"]


def run(recipe: str, seed: int, args, train, val, progress: Progress) -> dict:
    torch.manual_seed(seed)
    model = TinyGPT(vocab=256, d=args.d, layers=args.layers, heads=4, ctx=args.ctx, experts=args.moe)
    compiled = torch.compile(model, backend="autoprec", options={"recipe": recipe, "budget": args.budget})
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    stream = Batches(train, args.ctx, args.batch, seed=seed)
    task = progress.add_task(f"{recipe} seed {seed}", total=args.steps)
    losses, times = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = compiled(*stream.next())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
        progress.advance(task)
    held_out = Batches(val, args.ctx, args.batch, seed=10_000)
    val_loss = sum(compiled(*held_out.next()).item() for _ in range(args.val_batches)) / args.val_batches
    plan = autoprec.plan(compiled)
    steady = times[3:] or times
    return {
        "recipe": recipe, "seed": seed, "val_loss": val_loss, "losses": losses,
        "speedup": plan.projected_speedup(), "nvfp4_share": plan.flop_share().get("nvfp4", 0.0),
        "sec_per_step": sum(steady) / len(steady),
        "formats": [(d.module, str(d.role), d.fmt) for d in plan.decisions],
    }


def table(results: list[dict], seeds: list[int]) -> str:
    base = {r["seed"]: r["val_loss"] for r in results if r["recipe"] == "bf16"}
    head = f"{'recipe':<14}" + "".join(f"{'val s' + str(s):>10}" for s in seeds)
    lines = [head + f"{'gap vs bf16':>13}{'GB300 x':>9}{'NVFP4 FLOPs':>13}{'CPU s/step':>12}"]
    for recipe in dict.fromkeys(r["recipe"] for r in results):
        rows = {r["seed"]: r for r in results if r["recipe"] == recipe}
        gaps = [100 * (rows[s]["val_loss"] / base[s] - 1) for s in seeds if s in base]
        first = rows[seeds[0]]
        lines.append(
            f"{recipe:<14}" + "".join(f"{rows[s]['val_loss']:>10.4f}" for s in seeds)
            + f"{sum(gaps) / len(gaps):>12.2f}%{first['speedup']:>9.2f}{100 * first['nvfp4_share']:>12.0f}%"
            + f"{sum(r['sec_per_step'] for r in rows.values()) / len(rows):>12.3f}"
        )
    return "\n".join(lines)


def plots(results: list[dict], out: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no PNGs written")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        ax.plot(r["losses"], label=f"{r['recipe']} s{r['seed']}", linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("train loss")
    ax.set_title("training loss per recipe")
    ax.legend(fontsize=7, ncol=2)
    fig.savefig(out / "quality_loss.png", dpi=120, bbox_inches="tight")

    maps = [r for r in results if r["seed"] == results[0]["seed"]]
    fig, axes = plt.subplots(1, len(maps), figsize=(3.2 * len(maps), 6), squeeze=False)
    for i, (ax, r) in enumerate(zip(axes[0], maps)):
        modules = list(dict.fromkeys(m for m, _, _ in r["formats"]))
        grid = [[-1] * len(ROLES) for _ in modules]
        for m, role, fmt in r["formats"]:
            grid[modules.index(m)][ROLES.index(role)] = max(grid[modules.index(m)][ROLES.index(role)],
                                                            FORMATS.index(fmt))
        ax.imshow(grid, cmap=matplotlib.colors.ListedColormap(["white", "#4c72b0", "#dd8452", "#c44e52"]),
                  vmin=-1.5, vmax=2.5, aspect="auto")
        ax.set_xticks(range(len(ROLES)), ROLES)
        ax.set_yticks(range(len(modules)), modules if i == 0 else [], fontsize=6)
        ax.set_title(r["recipe"])
    fig.suptitle("format per module and role (blue bf16, orange mxfp8, red nvfp4)")
    fig.savefig(out / "quality_formats.png", dpi=120, bbox_inches="tight")
    print(f"wrote {out / 'quality_loss.png'} and {out / 'quality_formats.png'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--ctx", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--budget", type=float, default=0.01)
    parser.add_argument("--moe", type=int, default=0, help="experts per MoE MLP (0: dense MLPs)")
    parser.add_argument("--val-batches", type=int, default=8)
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    train, val = split(stdlib_bytes())
    seeds = list(range(args.seeds))
    recipes = args.recipes.split(",")
    results = []
    with Progress() as progress:
        for seed in seeds:
            for recipe in recipes:
                results.append(run(recipe, seed, args, train, val, progress))
    kind = f"MoE GPT ({args.moe} experts, top-2)" if args.moe else "GPT"
    print(f"{kind} {args.layers} layers, d={args.d}, ctx={args.ctx}, batch {args.batch}, {args.steps} steps, "
          f"seeds {seeds}, auto budget {args.budget}")
    print(table(results, seeds))
    (args.out / "quality.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                        "results": results}, indent=1))
    print(f"wrote {args.out / 'quality.json'}")
    plots(results, args.out)


if __name__ == "__main__":
    main()
