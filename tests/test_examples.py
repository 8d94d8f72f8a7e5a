"""The examples and benchmarks users run, end to end on small settings."""
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autoprec.kernels.triton.quantize_cols import INTERPRETER_TILE

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_rl_example_matches_bit_for_bit():
    out = run("examples/rl_matched.py")
    assert "sampler vs rl_trainer:   0.000e+00" in out
    mismatch = float(out.split("sampler vs BF16 trainer:")[1].split()[0])
    assert mismatch > 0


def test_rl_loop_example_stays_on_policy_through_weight_syncs():
    out = run("examples/rl_loop.py", "--steps", "2")
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and all("max |d log p| 0, 100% bit-identical" in line for line in steps)


@pytest.mark.slow
def test_rl_benchmarks_quick():
    """benchmarks/rl_mismatch.py: matched trainers 0, the dynamic-scales and BF16 contrasts not; rl_decode.py times
    every plan's decode step against eager."""
    lines = run("benchmarks/rl_mismatch.py", "--quick").splitlines()
    matched = [line for line in lines if "static (default)" in line]
    assert len(matched) == 6 and all(line.split()[-1] == "100%" for line in matched)
    contrasts = [line for line in lines if "dynamic scales" in line or "BF16 trainer" in line]
    assert contrasts and any(line.split()[-1] != "100%" for line in contrasts)
    decode = run("benchmarks/rl_decode.py", "--quick")
    assert all(f"{r} plan" in decode for r in ("bf16", "nvfp4", "mxfp8"))


def test_overrides_example():
    out = run("examples/overrides.py")
    assert "lm_head              fprop  bf16   override: annotate(Linear) fprop" in out
    assert "override: 'blocks.*.attn.*' dgrad" in out
    assert "blocks.1.mlp.fc2     wgrad  mxfp8  plan file: edited in plan.json" in out


def test_train_example_prints_loss_and_plan():
    out = run("examples/train_gpt.py", "--steps", "3", "--layers", "1", "--d", "32", "--ctx", "32", "--batch", "2")
    assert "step    2  loss" in out and "validation loss" in out and "projected GEMM speedup" in out


def test_damage_fit_fits_on_one_family_and_ranks_the_other(tmp_path):
    """``damage_fit.py --quick``: every plan of both families trained and paired against BF16, features from the
    seed's auto calibration, non-negative weights fitted on the first family, a Spearman line per family."""
    out = run("benchmarks/damage_fit.py", "--quick", "--out", str(tmp_path))
    assert re.search(r"^weights \(% gap per unit of mean feature\): fprop_fisher [\d.e+-]+, dgrad_noise", out, re.M)
    assert len(re.findall(r"^Spearman \(predicted vs measured, 6 plans\): ", out, re.M)) == 2, out
    rows = json.loads((tmp_path / "damage_fit.json").read_text())
    assert len(rows) == 2 * 8 and all(r["stats_table"] for r in rows if r["recipe"] == "auto")


def test_damage_fit_arithmetic():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import damage_fit

    assert damage_fit.spearman([1, 2, 3, 4], [10, 20, 30, 25]) == pytest.approx(0.8)
    assert damage_fit.ranks([3.0, 1.0, 3.0]) == [1.5, 0.0, 1.5]
    x = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    assert damage_fit.nnls(x, [2.0, -1.0, 1.0]) == pytest.approx([1.5, 0.0])  # the negative weight is dropped
    assert damage_fit.nnls(x, [2.0, 3.0, 5.0]) == pytest.approx([2.0, 3.0])


def test_quality_benchmark_writes_its_table_and_json(tmp_path):
    """The protocol's rows on both model families: paired gaps, both projections, auto's paired differences."""
    auto = "auto@nv+light_grad+recal"  # auto at nvfp4_nvidia's speedup, gradient weights, recalibration
    out = run("benchmarks/quality.py", "--quick", "--seeds", "2", "--recipes", f"bf16,nvfp4_nvidia,nvfp4,{auto}",
              "--out", str(tmp_path))
    assert "gap vs bf16 (%)" in out and "at scale x" in out and f"{auto} - nvfp4: " in out
    data = json.loads((tmp_path / "quality.json").read_text())
    rows = {(r["model"], r["recipe"], r["seed"]): r for r in data["results"]}
    assert len(rows) == 2 * 4 * 2 and rows[("gpt", "nvfp4", 0)]["nvfp4_share"] > 0.9
    assert math.isfinite(rows[("llama", auto, 1)]["val_loss"])
    bf16 = rows[("gpt", "bf16", 0)]  # the validation loss: the mean of the last quarter's checkpoints
    assert bf16["val_steps"] == [2, 3] and bf16["val_loss"] == sum(bf16["val_losses"]) / 2
    assert rows[("llama", "bf16", 1)]["at_scale"] == 1.0 and len(rows[("gpt", auto, 0)]["losses"]) == 3
    assert rows[("gpt", auto, 0)]["damage_table"] and "pred. damage" in out
    nvfp4 = next(line for line in out.splitlines() if line.startswith("nvfp4 "))
    assert nvfp4.split()[-1] != "-"  # fixed recipes are scored with the seed's auto calibration
    assert (tmp_path / "quality_pareto.png").stat().st_size > 0 and (tmp_path / "quality_loss.png").exists()


def test_quality_benchmark_moe_option(tmp_path):
    out = run("benchmarks/quality.py", "--quick", "--seeds", "1", "--models", "gpt", "--recipes", "bf16",
              "--moe", "4", "--out", str(tmp_path))
    assert "MoE 4 experts top-2" in out
    first = json.loads((tmp_path / "quality.json").read_text())["results"]
    # --resume keeps those runs and adds only the new row; other protocol settings are refused by name
    out = run("benchmarks/quality.py", "--quick", "--seeds", "1", "--models", "gpt", "--recipes", "bf16,nvfp4",
              "--moe", "4", "--out", str(tmp_path), "--resume")
    resumed = json.loads((tmp_path / "quality.json").read_text())["results"]
    assert [r["recipe"] for r in resumed] == ["bf16"] * 2 + ["nvfp4"] * 2  # --quick: 2 seeds
    assert resumed[:2] == first
    assert ("blocks.0.mlp", "fprop", "nvfp4") in map(tuple, resumed[2]["formats"]) and "nvfp4 " in out
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    refused = subprocess.run([sys.executable, "benchmarks/quality.py", "--quick", "--seeds", "1", "--models", "gpt",
                              "--recipes", "bf16", "--out", str(tmp_path), "--resume"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "was run with moe=4, this run has moe=0" in refused.stderr


def timed_rows(out: str) -> list[str]:
    """The names of the kernel rows ``kernels_gpu.py`` printed with a time (name, then ms with three decimals)."""
    return re.findall(r"^ *(\S.*?)\s+\d+\.\d{3}\s+\d+\s", out, re.M)


def test_gpu_benchmark_dry_run_prints_every_section_and_row():
    """``kernels_gpu.py --dry-run`` runs every kernel section the GPU run prints once on the CPU (Triton's
    interpreter): each section's header and each row, none reported failed (the grouped and sweep sections
    print a failure and go on)."""
    out = run("benchmarks/kernels_gpu.py", "--dry-run", "--no-step", "--sweep")
    assert "failed" not in out, out
    sections = re.findall(r"^(quantize, inductor reference|quantize|matmul|tile sweep|grouped fprop|grouped wgrad|bmm|"
                          r"grouped quantize)\b", out, re.M)
    assert sections == ["quantize", "quantize, inductor reference"] + ["matmul"] * 3 + [
        "tile sweep", "grouped fprop", "grouped wgrad", "bmm", "grouped quantize"], out
    rows = timed_rows(out)
    assert len(rows) == 19 + 1 + 3 * 12 + 2 * (8 + 5 + 4) + 2 * 7 + 5 + 9, out  # the dry run's one inductor row
    assert re.search(r"^nvfp4 rows .*x the Triton kernel's speed$", out, re.M), out
    assert {"nvfp4 cols sr + rht", "mxfp8 one read, activation", "nvfp4 both, rne", "nvfp4 one read, rne",
            "autoprec nvfp4 (tensor_core)", "+ quantize x, w", "decoded + cuBLAS", "decoded + Triton GEMM",
            "decoded + Triton TMA GEMM", "nvfp4 dec 128x128x64 w8 s3", "mxfp8 tma 256x128x64 w8 s3",
            "nvfp4 + quantize, per group", "+ quantize q, k", "nvfp4 weights, batched",
            "nvfp4 weights 1x16, batched", "fp8_block 128x128", "fp8_block cols (wgrad copy)"} <= set(rows)
    # no blockwise GEMM in the interpreter: each matmul section says why it left FP8-block out
    assert len(re.findall(r"^autoprec fp8_block +not timed: \S", out, re.M)) == 3, out
    chosen = dict(re.findall(r"^(\S.*?)\s+\d+\.\d{3}\s+\d+\s+\d+%  (\d+x\d+/\d+)$", out, re.M))
    slices = "{BR}x{BK}/".format(**INTERPRETER_TILE.kwargs) + str(INTERPRETER_TILE.num_warps)
    assert chosen["nvfp4 cols sr + rht"] == chosen["mxfp8 cols"] == slices, chosen  # the slice kernels' choice
    assert "nvfp4 both, activation" not in chosen and chosen["nvfp4 rows"] != slices, chosen


@pytest.mark.slow
def test_gpu_benchmark_dry_run_times_each_plans_step():
    """``--dry-run --step-only``: the training-step section's rows (bf16, three plans, the two CUDA-graph rows run
    without graphs on the CPU) with their FLOP shares, and a profile table per plan."""
    out = run("benchmarks/kernels_gpu.py", "--dry-run", "--step-only", "--layers", "1", "--profile", "--graphs")
    steps = re.findall(r"^(\S.*?)\s+\d+\.\d\s+\d+\.\d\d\s+[\d.]+/[\d.]+/[\d.]+  ", out, re.M)  # name, ms, x bf16, calls
    assert steps == ["bf16 (inductor)", "autoprec nvfp4", "autoprec mxfp8", "autoprec auto", "bf16 (CUDA graphs)",
                     "autoprec nvfp4 (CUDA graphs)"], out
    assert out.count("one step's top ops by CPU time") == 3
    assert re.search(r"^autoprec auto .* bf16 \d+% nvfp4 \d+%", out, re.M), out


def test_host_overhead_benchmark_times_every_op():
    out = run("benchmarks/host_overhead.py", "--calls", "5")
    assert len(re.findall(r"^  (quantize|scaled_mm|grouped_mm) .* us$", out, re.M)) == 8


@pytest.mark.slow
def test_host_overhead_benchmark_times_whole_steps():
    """--step: unplanned (fp32), then each plan's step with its quantization, Triton NVFP4 amax pass, matmul and
    Triton launch counts (198, 0, 99 and 396 for 8 layers under nvfp4: every tensor is quantized both ways, the
    graph computes each NVFP4 tensor amax without the RHT (passes/graph_amax.py), a pair with the RHT on one copy
    takes one amax pass for both (nvfp4_nvidia, whose 16x16 weights' dgrad copies are one transpose launch each),
    and a matmul decodes both operands in one launch, then runs its epilogue where NVFP4 tensor scales or an fp32
    bias need one, and for MXFP8 its guarded recompute, which returns at once for exact values)."""
    out = run("benchmarks/host_overhead.py", "--calls", "5", "--step")
    rows = re.findall(r"^  (fp32|nvfp4|nvfp4_nvidia|mxfp8) +[\d.]+ +[\d.]+ +(\d+) +(\d+) +(\d+) +(\d+)$", out, re.M)
    assert rows == [("fp32", "0", "0", "0", "0"), ("nvfp4", "198", "0", "99", "396"),
                    ("nvfp4_nvidia", "120", "48", "99", "342"), ("mxfp8", "198", "0", "99", "420")], out
