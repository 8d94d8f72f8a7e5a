"""Fit the damage model's per-role constants on measured gaps of one model family, validate on the other.

    OMP_NUM_THREADS=1 python benchmarks/damage_fit.py [--fit gpt --validate llama] [--mixtures 6] [--seeds 3]
                                                      [--steps 300] [--layers 2] [--d 64] [--quick]

Per family: the recipes (mxfp8, nvfp4, nvfp4_nvidia, nvfp4 on fprop only, mxfp8 forward + nvfp4 backward) and
``--mixtures`` random per-GEMM plans (``mixture``) are trained with ``quality.py``'s protocol, paired against BF16
over ``--seeds`` seeds (the validation loss averaged over the last quarter). Every plan's features come from the
same calibration the solver sees (an ``auto`` run of the seed, ``measure="all"``), averaged over the plan's GEMMs:
the forward's loss-weighted error (the Fisher score Σ(∂L/∂Y)²(Ŷ-Y)² / Σ(∂L/∂Y)²Y², ModelOpt AutoQuantize's), and for
dgrad and wgrad their relative noise |Ĝ-G|²/|G|² and relative bias. The gradient terms are relative to the
gradient's own size, which is what Adam's update divides by (its second moment is the gradient's running square), so
they are the update's relative error to first order. The model: predicted gap (%) = Σ w_i · feature_i with w >= 0,
fitted by least squares on ``--fit``'s plans; printed: the weights, each plan's predicted and measured gap, and the
Spearman rank correlation on each family's plans (the held-out ``--validate`` family's is the test). ``--quick`` is
a seconds-long smoke run.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from quality import FIXED, build, mean_se, protocol_arguments, quick, run
from rich.progress import Progress

from autoprec.roles import MatmulRole

from corpus import split, stdlib_bytes

RECIPES = ["mxfp8", "nvfp4", "nvfp4_nvidia", "nvfp4_fprop_only", "mxfp8_fwd+nvfp4_bwd"]
FEATURES = ("fprop_fisher", "dgrad_noise", "dgrad_bias", "wgrad_noise", "wgrad_bias")
MIX_FORMATS = ("bf16", "mxfp8", "nvfp4")


def linear_modules(family: str, args) -> list[str]:
    """The root-relative names of the model's Linears: the modules a mixture plan assigns formats to."""
    return [n for n, m in build(family, args).named_modules() if isinstance(m, torch.nn.Linear)]


def mixture(family: str, index: int, args) -> dict:
    """Options of mixture ``index`` (a fixed random stream): even mixtures give every (Linear, role) a format drawn
    from MIX_FORMATS (NVFP4 gradients then take SR, and wgrad the RHT: unbiased); odd ones start from the ``nvfp4``
    recipe (round-to-nearest everywhere: biased gradients) and move a random share of the (Linear, role) pairs to
    one of MIX_FORMATS, so the plans span gaps from BF16's to round-to-nearest's."""
    rng = random.Random(1000 + index)
    pairs = [(name, role) for name in linear_modules(family, args) for role in ("fprop", "dgrad", "wgrad")]
    if index % 2 == 0:
        overrides: dict = {}
        for name, role in pairs:
            overrides.setdefault(name, {})[role] = rng.choice(MIX_FORMATS)
        return {"recipe": "bf16", "overrides": overrides}
    share = rng.uniform(0.2, 0.8)
    overrides = {}
    for name, role in pairs:
        if rng.random() < share:
            overrides.setdefault(name, {})[role] = rng.choice(MIX_FORMATS)
    return {"recipe": "nvfp4", "overrides": overrides}


def plans(family: str, args) -> dict[str, dict]:
    out = {"bf16": dict(FIXED["bf16"])}
    out.update({name: dict(FIXED[name]) for name in RECIPES})
    out.update({f"mix{i}": mixture(family, i, args) for i in range(args.mixtures)})
    out["auto"] = {"recipe": "auto", "measure": "all"}  # the calibration every plan's features come from
    return out


def features(row: dict, auto: dict) -> list[float]:
    """The plan's mean per-GEMM terms, from the seed's auto calibration (``stats_table``: err, bias, loss)."""
    sums = dict.fromkeys(FEATURES, 0.0)
    for key, label in row["choices"].items():
        stat = auto["stats_table"].get(key, {}).get(label)
        if label.startswith("bf16") or stat is None:
            continue
        role = MatmulRole(key.split("|")[1])
        err, bias, loss = stat
        if role is MatmulRole.FPROP:
            sums["fprop_fisher"] += loss if loss is not None else err
        else:
            sums[f"{role}_noise"] += err
            sums[f"{role}_bias"] += abs(bias)
    n = max(1, len(row["choices"]))
    return [sums[f] / n for f in FEATURES]


def nnls(x: list[list[float]], y: list[float]) -> list[float]:
    """Least squares with non-negative weights, exactly: the best unconstrained fit over every subset of the
    features whose weights come out non-negative (five features: 31 subsets)."""
    xt, yt = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    best, best_err = [0.0] * xt.shape[1], float(yt.pow(2).sum())
    for size in range(1, xt.shape[1] + 1):
        for cols in itertools.combinations(range(xt.shape[1]), size):
            sub = xt[:, list(cols)]
            w = torch.linalg.lstsq(sub, yt.unsqueeze(1), driver="gelsd").solution.squeeze(1)
            if (w < 0).any():
                continue
            err = float((sub @ w - yt).pow(2).sum())
            if err < best_err:
                best_err, best = err, [0.0] * xt.shape[1]
                for c, v in zip(cols, w.tolist()):
                    best[c] = v
    return best


def ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else float("nan")


def measure(family: str, args, data, progress: Progress, results: list[dict]
            ) -> dict[str, tuple[float, float, list]]:
    """Each plan's paired gap to BF16 in % (mean, standard error) and mean features over the seeds."""
    for name, options in plans(family, args).items():
        for seed in range(args.seeds):
            if not any(r["model"] == family and r["recipe"] == name and r["seed"] == seed for r in results):
                results.append(run(family, name, seed, args, data, progress, options))
                (args.out / "damage_fit.json").write_text(json.dumps(results))
    out = {}
    for name in plans(family, args):
        if name in ("bf16", "auto"):
            continue
        gaps, feats = [], []
        for seed in range(args.seeds):
            row, base, auto = (next(r for r in results
                                    if r["model"] == family and r["recipe"] == n and r["seed"] == seed)
                               for n in (name, "bf16", "auto"))
            gaps.append(100 * (row["val_loss"] / base["val_loss"] - 1))
            feats.append(features(row, auto))
        m, se = mean_se(gaps)
        out[name] = (m, se, [sum(f[i] for f in feats) / len(feats) for i in range(len(FEATURES))])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", default="gpt")
    parser.add_argument("--validate", default="llama")
    parser.add_argument("--mixtures", type=int, default=6)
    protocol_arguments(parser, layers=2, d=64, ctx=64, batch=16, steps=300, seeds=3, val_batches=10)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 layer, d=32, 3 steps, 1 seed")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs of --out/damage_fit.json (made with the same settings) and add the missing")
    args = parser.parse_args()
    if args.quick:
        quick(args, seeds=1)
        args.mixtures = 1
    args.out.mkdir(parents=True, exist_ok=True)
    data = split(stdlib_bytes())
    path = args.out / "damage_fit.json"
    results: list[dict] = json.loads(path.read_text()) if args.resume and path.exists() else []
    with Progress() as progress:
        measured = {family: measure(family, args, data, progress, results) for family in (args.fit, args.validate)}
    fit = measured[args.fit]
    weights = nnls([f for _, _, f in fit.values()], [m for m, _, _ in fit.values()])
    print(f"{args.layers} layers, d={args.d}, ctx={args.ctx}, batch {args.batch}, {args.steps} steps, "
          f"{args.seeds} paired seeds; fitted on {args.fit}, validated on {args.validate}")
    print("weights (% gap per unit of mean feature): " + ", ".join(f"{n} {w:.3g}" for n, w in zip(FEATURES, weights)))
    for family, rows in measured.items():
        predicted = {name: sum(w * f for w, f in zip(weights, feats)) for name, (_, _, feats) in rows.items()}
        print(f"\n{family} ({'fit' if family == args.fit else 'held out'})")
        print(f"{'plan':<24}{'measured gap %':>18}{'predicted %':>13}")
        for name, (m, se, _) in rows.items():
            print(f"{name:<24}{m:>10.2f} ± {se:<5.2f}{predicted[name]:>13.2f}")
        rho = spearman([predicted[n] for n in rows], [rows[n][0] for n in rows])
        print(f"Spearman (predicted vs measured, {len(rows)} plans): {rho:.2f}")
    print(f"wrote {args.out / 'damage_fit.json'}")


if __name__ == "__main__":
    main()
