"""Quality vs projected speed: each recipe trained on the same models, seeds and data, paired against BF16.

    OMP_NUM_THREADS=1 python benchmarks/quality.py [--models gpt,llama] [--seeds 6] [--steps 400] [--quick]

Protocol (the defaults): a GPT (LayerNorm, GELU) and a Llama-style model (RMSNorm, SwiGLU, RoPE), 4 layers,
d=128, ctx 128, batch 32, 400 steps of AdamW (betas 0.9 / 0.95, weight decay 0.1) with linear warmup and
cosine decay, gradient clipping at 1.0, on the bytes of the Python stdlib. Every seed fixes the init and
the data order, the same for every recipe. The validation loss is the mean over 20 fixed held-out batches
in eval mode (no_grad: the plan's forward numerics), measured at 4 checkpoints over the last quarter of training
and averaged, over 6 paired seeds. Per recipe: the paired gap to BF16 in % (mean ±
standard error over seeds), the projected speedups (roofline at the traced shapes; at scale, at TE's
measured rates on a 4096-wide model), the NVFP4 FLOP share, CPU seconds per step; for every auto row, its
paired difference to each fixed recipe in standard errors; and every row's predicted damage: the mean
per-GEMM damage of its choices as the solver scores them (the seed's auto calibration), to compare with
the measured gap. Writes quality.json, quality_pareto.png and quality_loss.png to --out.
``--moe E`` replaces the GPT's MLPs by top-2 mixtures of E experts. ``--quick`` is a seconds-long smoke run.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import torch
from llama_model import TinyLlama
from rich.progress import Progress

import autoprec
from autoprec.planner.assign import damage
from autoprec.planner.candidates import Candidate
from autoprec.planner.model_planner import planners_of
from autoprec.roles import MatmulRole

from corpus import Batches, split, stdlib_bytes
from gpt_model import TinyGPT

FIXED = {
    "bf16": {"recipe": "bf16"},
    "mxfp8": {"recipe": "mxfp8"},
    "nvfp4": {"recipe": "nvfp4"},
    "nvfp4_nvidia": {"recipe": "nvfp4_nvidia"},
    "mxfp8_fwd+nvfp4_bwd": {"recipe": "mxfp8", "overrides": {"*": {"dgrad": "nvfp4", "wgrad": "nvfp4"}}},
    "nvfp4_fprop_only": {"recipe": "bf16", "overrides": {"*": {"fprop": "nvfp4"}}},
    "fp8_block": {"recipe": "fp8_block", "hardware": "h100"},  # Hopper's recipe, costed on Hopper's table
}
TAIL = 0.15  # the schedule row: the forward in BF16 for the last 15% of steps
LIGHT_GRAD = {"noise": 0.05, "bias": 0.25}  # auto rows "+light_grad": a damage model that charges gradients less
RECAL_TIMES = 4  # auto rows "+recal": the plan is measured and solved again every steps/4 steps


def recipe_options(name: str, steps: int, nvidia_speedup: float | None) -> dict:
    """Options of a row: a fixed recipe, ``nvfp4_nvidia+bf16_tail`` (a schedule), ``auto@X`` (least damage at
    an at-scale speedup X; ``auto@nv``: at nvfp4_nvidia's; suffix ``+light_grad``: with LIGHT_GRAD as the
    backward damage weights; ``+recal``: re-calibrated every steps/RECAL_TIMES steps) or ``auto``."""
    if name in FIXED:
        return dict(FIXED[name])
    if name == "nvfp4_nvidia+bf16_tail":
        return {"recipe": "nvfp4_nvidia", "schedule": [{"from_step": max(1, round(steps * (1 - TAIL))),
                                                        "overrides": {"*": {"fprop": "bf16"}}}]}
    if name == "auto":  # measure="all": the damage table also scores the biased configurations
        return {"recipe": "auto", "measure": "all"}
    if name.startswith("auto@"):
        target, *extras = name[5:].split("+")
        if not set(extras) <= {"light_grad", "recal"}:
            raise ValueError(f"recipe row {name!r}: unknown suffix; valid: +light_grad, +recal")
        if target == "nv" and nvidia_speedup is None:
            raise ValueError("auto@nv needs the nvfp4_nvidia row first (it targets its at-scale speedup)")
        opts = {"recipe": "auto", "measure": "all", "cost": "at_scale",
                "target_speedup": nvidia_speedup if target == "nv" else float(target)}
        if "light_grad" in extras:
            opts["grad_weights"] = LIGHT_GRAD
        if "recal" in extras:
            opts["recalibrate_every"] = max(1, steps // RECAL_TIMES)
        return opts
    raise ValueError(f"unknown recipe row {name!r}; valid: {', '.join(FIXED)}, nvfp4_nvidia+bf16_tail, auto, "
                     "auto@X[+light_grad][+recal]")


def build(family: str, args) -> torch.nn.Module:
    if family == "llama":
        return TinyLlama(vocab=256, d=args.d, layers=args.layers, heads=4)
    return TinyGPT(vocab=256, d=args.d, layers=args.layers, heads=4, ctx=args.ctx, experts=args.moe)


def lr_at(step: int, args) -> float:
    """Linear warmup over 10% of the steps, then cosine decay to 10% of the peak."""
    warm = max(1, args.steps // 10)
    if step < warm:
        return (step + 1) / warm
    return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, args.steps - warm)))


def run(family: str, name: str, seed: int, args, data, progress: Progress, options: dict) -> dict:
    """One training run of row ``name`` (its autoprec ``options``) on ``family`` from ``seed``."""
    train, val = data
    torch._dynamo.reset()  # a fresh compile per run (dynamo stops compiling a code object after 8 recompiles)
    torch.manual_seed(seed)
    model = build(family, args)
    compiled = torch.compile(model, backend="autoprec", options=options)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, args))
    stream = Batches(train, args.ctx, args.batch, seed=seed)
    task = progress.add_task(f"{family} {name} seed {seed}", total=args.steps)
    losses, times, val_losses = [], [], []
    checkpoints = validation_steps(args.steps, args.checkpoints)
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        loss = compiled(*stream.next())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
        progress.advance(task)
        if step in checkpoints:
            val_losses.append(validation_loss(model, compiled, val, args))
    val_loss = sum(val_losses) / len(val_losses)
    plan = autoprec.plan(compiled)
    state = planners_of(model)[-1]
    stats = state.calibration.stats if state.calibration else {}
    damages = {"|".join(map(str, k)): {c.label: damage(st, MatmulRole(k[1])) for c, st in by_cand.items()}
               for k, by_cand in stats.items()}
    raw = {"|".join(map(str, k)): {c.label: (st.err, st.bias, st.loss) for c, st in by_cand.items()}
           for k, by_cand in stats.items()}
    steady = times[3:] or times
    return {
        "model": family, "recipe": name, "seed": seed, "val_loss": val_loss, "val_losses": val_losses,
        "val_steps": sorted(checkpoints), "losses": losses,
        "speedup": plan.projected_speedup(), "at_scale": plan.projected_speedup(at_scale=True),
        "nvfp4_share": plan.flop_share().get("nvfp4", 0.0), "sec_per_step": sum(steady) / len(steady),
        "formats": [(d.module, str(d.role), d.fmt) for d in plan.decisions],
        "choices": {"|".join(map(str, d.key)): Candidate(d.fmt, d.rounding, d.rht, d.tile2d).label
                    for d in plan.decisions},
        "damage_table": damages,  # auto rows: every measured candidate's damage, per GEMM
        "stats_table": raw,  # auto rows: every measured candidate's (err, bias, loss), per GEMM
    }


def validation_steps(steps: int, checkpoints: int) -> set[int]:
    """The steps after which the validation loss is measured: ``checkpoints`` evenly spaced over the last quarter of
    training, the last step included. Their mean is what the gaps compare: one checkpoint's loss moves with the
    last few batches, an average over the quarter does much less."""
    first = steps - steps / 4
    return {max(1, round(first + (steps - first) * (i + 1) / checkpoints)) for i in range(checkpoints)}


def validation_loss(model: torch.nn.Module, compiled, val, args) -> float:
    """The mean loss over ``args.val_batches`` fixed held-out batches, in eval mode (the plan's forward)."""
    model.eval()
    held_out = Batches(val, args.ctx, args.batch, seed=10_000)
    with torch.no_grad():
        loss = sum(compiled(*held_out.next()).item() for _ in range(args.val_batches)) / args.val_batches
    model.train()
    return loss


def predicted_damage(results: list[dict], row: dict) -> float | None:
    """The mean per-GEMM damage of a row's choices, scored with the calibration of the first auto row of
    the same model and seed (the same initial weights and first batch): the solver's view of any plan."""
    auto = next((r for r in results if r["model"] == row["model"] and r["seed"] == row["seed"]
                 and r["damage_table"]), None)
    if auto is None:
        return None
    scores = [auto["damage_table"][k][label] for k, label in row["choices"].items()
              if label in auto["damage_table"].get(k, {})]
    return sum(scores) / len(scores) if scores else None


def mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    m = sum(xs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else float("nan")
    return m, sd / math.sqrt(n)


def gaps(results: list[dict], family: str, recipe: str) -> dict[int, float]:
    """Per seed: the recipe's validation loss over BF16's, in % above it."""
    base = {r["seed"]: r["val_loss"] for r in results if r["model"] == family and r["recipe"] == "bf16"}
    return {r["seed"]: 100 * (r["val_loss"] / base[r["seed"]] - 1) for r in results
            if r["model"] == family and r["recipe"] == recipe and r["seed"] in base}


def table(results: list[dict], family: str, recipes: list[str]) -> str:
    lines = [f"{'recipe':<24}{'gap vs bf16 (%)':>18}{'at scale x':>12}{'roofline x':>12}{'NVFP4 FLOPs':>13}"
             f"{'CPU s/step':>12}{'pred. damage':>14}"]
    for recipe in recipes:
        rows = [r for r in results if r["model"] == family and r["recipe"] == recipe]
        if not rows:
            continue
        m, se = mean_se(list(gaps(results, family, recipe).values()))
        dmg = predicted_damage(results, rows[0])
        lines.append(f"{recipe:<24}{m:>10.2f} ± {se:<5.2f}{rows[0]['at_scale']:>12.2f}{rows[0]['speedup']:>12.2f}"
                     f"{100 * rows[0]['nvfp4_share']:>12.0f}%{sum(r['sec_per_step'] for r in rows) / len(rows):>12.3f}"
                     + (f"{dmg:>14.1e}" if dmg is not None else f"{'-':>14}"))
    for auto in [r for r in recipes if r.startswith("auto")]:
        mine = gaps(results, family, auto)
        for fixed in [r for r in recipes if not r.startswith("auto") and r != "bf16"]:
            other = gaps(results, family, fixed)
            diffs = [mine[s] - other[s] for s in mine if s in other]
            if len(diffs) > 1:
                m, se = mean_se(diffs)
                lines.append(f"  {auto} - {fixed}: {m:+.2f}% ± {se:.2f} ({m / se if se else float('nan'):+.1f} SE)")
    return "\n".join(lines)


def plots(results: list[dict], families: list[str], recipes: list[str], out: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no PNGs written")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(families), figsize=(6.5 * len(families), 5), squeeze=False)
    for ax, family in zip(axes[0], families):
        for recipe in recipes:
            rows = [r for r in results if r["model"] == family and r["recipe"] == recipe]
            if rows:
                m, se = mean_se(list(gaps(results, family, recipe).values()))
                ax.errorbar(rows[0]["at_scale"], m, yerr=0 if math.isnan(se) else se, fmt="o", capsize=3)
                ax.annotate(recipe, (rows[0]["at_scale"], m), fontsize=7, xytext=(4, 4), textcoords="offset points")
        ax.set_xlabel("projected GEMM speedup at scale (TE B300 rates)")
        ax.set_ylabel("validation loss gap vs BF16 (%), mean ± SE")
        ax.set_title(family)
    fig.savefig(out / "quality_pareto.png", dpi=120, bbox_inches="tight")
    fig, axes = plt.subplots(1, len(families), figsize=(6.5 * len(families), 5), squeeze=False)
    for ax, family in zip(axes[0], families):
        for r in [r for r in results if r["model"] == family and r["seed"] == results[0]["seed"]]:
            ax.plot(r["losses"], label=r["recipe"], linewidth=0.8)
        ax.set_xlabel("step")
        ax.set_ylabel("train loss")
        ax.set_title(family)
        ax.legend(fontsize=7)
    fig.savefig(out / "quality_loss.png", dpi=120, bbox_inches="tight")
    print(f"wrote {out / 'quality_pareto.png'} and {out / 'quality_loss.png'}")


DEFAULT_ROWS = [*FIXED, "nvfp4_nvidia+bf16_tail", "auto@1.4", "auto@nv", "auto@nv+light_grad", "auto@nv+recal",
                "auto@1.75"]


def write_json(results: list[dict], args) -> None:
    (args.out / "quality.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                        "results": results}, indent=1))


PROTOCOL = ("layers", "d", "ctx", "batch", "steps", "lr", "val_batches", "moe")


def earlier_results(args) -> list[dict]:
    """The runs of --out's quality.json, made under the same protocol settings (else a ValueError naming the
    setting that differs): rows and seeds already there are not run again."""
    path = args.out / "quality.json"
    if not path.exists():
        return []
    saved = json.loads(path.read_text())
    for key in PROTOCOL:
        if saved["args"].get(key) != str(getattr(args, key)):
            raise ValueError(f"--resume: {path} was run with {key}={saved['args'].get(key)}, this run has "
                             f"{key}={getattr(args, key)}")
    return saved["results"]


def protocol_arguments(parser: argparse.ArgumentParser, layers: int = 4, d: int = 128, ctx: int = 128,
                       batch: int = 32, steps: int = 400, seeds: int = 6, val_batches: int = 20) -> None:
    """The training protocol's options (``run`` reads them), with these defaults; ``--quick`` is ``quick``'s."""
    parser.add_argument("--layers", type=int, default=layers)
    parser.add_argument("--d", type=int, default=d)
    parser.add_argument("--ctx", type=int, default=ctx)
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--seeds", type=int, default=seeds)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--val-batches", type=int, default=val_batches)
    parser.add_argument("--checkpoints", type=int, default=4,
                        help="validation checkpoints over the last quarter of training; the gaps compare their mean")
    parser.add_argument("--moe", type=int, default=0, help="experts per MoE MLP of the GPT (0: dense MLPs)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out")


def quick(args, seeds: int) -> None:
    """``--quick``'s smoke-run protocol: 1 layer, d=32, 3 steps, ``seeds`` seeds."""
    args.layers, args.d, args.ctx, args.batch, args.steps, args.seeds, args.val_batches = 1, 32, 32, 2, 3, seeds, 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt,llama")
    protocol_arguments(parser)
    parser.add_argument("--recipes", default=",".join(DEFAULT_ROWS))
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 layer, d=32, 3 steps, 2 seeds")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs of --out/quality.json (same settings) and run only the missing ones")
    args = parser.parse_args()
    if args.quick:
        quick(args, seeds=2)
    args.out.mkdir(parents=True, exist_ok=True)
    families, recipes = args.models.split(","), args.recipes.split(",")
    for r in recipes:
        recipe_options(r, args.steps, 1.0)  # an unknown row fails before any training
    data = split(stdlib_bytes())
    results = earlier_results(args) if args.resume else []
    with Progress() as progress:
        for family in families:
            for recipe in recipes:  # row by row: a run cut short has every seed of its first rows
                for seed in range(args.seeds):
                    if any(r["model"] == family and r["recipe"] == recipe and r["seed"] == seed for r in results):
                        continue
                    nvidia = next((r["at_scale"] for r in results if r["model"] == family and r["seed"] == seed
                                   and r["recipe"] == "nvfp4_nvidia"), None)
                    options = recipe_options(recipe, args.steps, nvidia)
                    results.append(run(family, recipe, seed, args, data, progress, options))
                    write_json(results, args)  # after every run: a long run cut short keeps what it measured
    moe = f", MoE {args.moe} experts top-2" if args.moe else ""
    print(f"{args.layers} layers, d={args.d}, ctx={args.ctx}, batch {args.batch}, {args.steps} steps, "
          f"seeds {list(range(args.seeds))}{moe}")
    for family in families:
        print(f"\n{family}\n{table(results, family, recipes)}")
    print(f"wrote {args.out / 'quality.json'}")
    plots(results, families, recipes, args.out)


if __name__ == "__main__":
    main()
