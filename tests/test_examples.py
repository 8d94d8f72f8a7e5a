"""The examples and benchmarks users run, end to end on small settings."""
import json
import os
import subprocess
import sys
from pathlib import Path

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


def test_overrides_example():
    out = run("examples/overrides.py")
    assert "lm_head              fprop  bf16   override: annotate(Linear) fprop" in out
    assert "override: 'blocks.*.attn.*' dgrad" in out
    assert "blocks.1.mlp.fc2     wgrad  mxfp8  plan file: edited in plan.json" in out


def test_train_example_prints_loss_and_plan():
    out = run("examples/train_gpt.py", "--steps", "3", "--layers", "1", "--d", "32", "--ctx", "32", "--batch", "2")
    assert "step    2  loss" in out and "validation loss" in out and "projected GEMM speedup" in out


def test_quality_benchmark_writes_its_table_and_json(tmp_path):
    out = run("benchmarks/quality.py", "--steps", "3", "--seeds", "1", "--layers", "1", "--d", "32", "--ctx", "32",
              "--batch", "2", "--val-batches", "1", "--recipes", "bf16,nvfp4,auto", "--out", str(tmp_path))
    assert "gap vs bf16" in out and "auto" in out
    data = json.loads((tmp_path / "quality.json").read_text())
    rows = {r["recipe"]: r for r in data["results"]}
    assert set(rows) == {"bf16", "nvfp4", "auto"} and rows["nvfp4"]["nvfp4_share"] > 0.9  # head dim 8: BF16
    assert rows["bf16"]["speedup"] == 1.0 and len(rows["auto"]["losses"]) == 3


def test_quality_benchmark_moe_option(tmp_path):
    out = run("benchmarks/quality.py", "--steps", "3", "--seeds", "1", "--layers", "1", "--d", "32", "--ctx", "32",
              "--batch", "2", "--val-batches", "1", "--recipes", "bf16,nvfp4", "--moe", "4", "--out",
              str(tmp_path))
    assert "MoE GPT (4 experts, top-2)" in out
    rows = {r["recipe"]: r for r in json.loads((tmp_path / "quality.json").read_text())["results"]}
    assert ("blocks.0.mlp", "fprop", "nvfp4") in map(tuple, rows["nvfp4"]["formats"])
