"""The planner: calibration scores, the budgeted solver, presets, overrides, plan files, RL matching."""
import copy
import json
import re

import pytest
import torch

import autoprec
from autoprec.planner import candidates as C
from autoprec.planner.assign import damage
from autoprec.planner.calibration import Stat
from autoprec.planner.cost import HARDWARE, device_note, gemm_seconds
from autoprec.planner.model_planner import PLANNERS, planners_of
from autoprec.planner.options import parse_options
from autoprec.planner.plan import COLUMNS, SHORT_COLUMNS, Decision, Plan
from autoprec.roles import MatmulRole

from gpt_model import TinyGPT, tokens
from helpers import bits_equal

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def model(**kw) -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(vocab=64, d=64, layers=2, heads=2, ctx=16, **kw)


def train_steps(m, steps: int = 2, **options):
    c = torch.compile(m, backend="autoprec", options=options)
    idx, tgt = tokens(batch=4, ctx=16, vocab=64)
    losses = []
    for _ in range(steps):
        loss = c(idx, tgt)
        loss.backward()
        losses.append(loss.detach())
    return c, losses


def mean_damage(plan: Plan) -> float:
    free = [d for d in plan.decisions if d.reason.startswith("auto")]
    return sum(damage(Stat(d.err, d.bias, d.loss), d.role) for d in free) / len(free)


def test_calibration_scores_and_budget():
    c, _ = train_steps(model(), budget=0.01)
    plan = autoprec.plan(c)
    assert all(d.err is not None and d.bias is not None for d in plan.decisions)
    assert all(d.loss is not None for d in plan.decisions if str(d.role) == "fprop")
    assert all(d.loss is None for d in plan.decisions if str(d.role) != "fprop")
    assert mean_damage(plan) <= 0.01
    assert "nvfp4" in plan.flop_share() and plan.projected_speedup() > 1.0


def test_calibration_measures_what_the_solver_may_pick():
    """By default calibration scores only the eligible configurations; measure="all" adds the biased
    backward ones (round-to-nearest on gradients, SR without the RHT on wgrad), and the plan is the same."""
    biased = {(role, cand) for role, cands in C.BIASED.items() for cand in cands}
    plans = []
    for measure in ("eligible", "all"):
        torch._dynamo.reset()
        m = model()
        c, _ = train_steps(m, 1, measure=measure)
        stats = planners_of(m)[-1].calibration.stats
        measured = {(MatmulRole(key[1]), cand) for key, by_cand in stats.items() for cand in by_cand}
        assert measured & biased == (biased if measure == "all" else set())
        assert all(cand in C.ELIGIBLE[role] for role, cand in measured - biased)
        plans.append([(d.module, str(d.role), d.fmt, d.rounding, d.rht, d.tile2d, d.err)
                      for d in autoprec.plan(c).decisions])
    assert plans[0] == plans[1]


def test_bigger_budget_buys_more_fp4():
    shares, speedups = [], []
    for budget in (0.002, 0.01, 0.05):
        torch._dynamo.reset()
        PLANNERS.clear()
        c, _ = train_steps(model(), budget=budget)
        plan = autoprec.plan(c)
        assert mean_damage(plan) <= budget
        shares.append(plan.flop_share().get("nvfp4", 0.0))
        speedups.append(plan.projected_speedup())
    assert shares == sorted(shares) and speedups == sorted(speedups) and shares[-1] > shares[0]


def test_gradient_weights_steer_the_budget():
    """grad_weights prices backward GEMMs: at zero weight every backward GEMM the policy allows in NVFP4
    takes it (its damage is free), and the budget still bounds the mean damage as so weighted."""
    backward_fp4 = []
    for weights in ({}, {"noise": 0.0, "bias": 0.0}):
        torch._dynamo.reset()
        PLANNERS.clear()
        c, _ = train_steps(model(), budget=0.002, grad_weights=weights)
        free = [d for d in autoprec.plan(c).decisions if d.reason.startswith("auto")]
        w = parse_options({"grad_weights": weights}).damage_weights()
        assert sum(damage(Stat(d.err, d.bias, d.loss), d.role, w) for d in free) / len(free) <= 0.002
        backward = [d for d in free if str(d.role) != "fprop"]
        backward_fp4.append(sum(d.fmt == "nvfp4" for d in backward) / len(backward))
    assert backward_fp4[0] < backward_fp4[1] == 1.0


def test_target_speedup_mode():
    c, _ = train_steps(model(), target_speedup=1.2)
    plan = autoprec.plan(c)
    assert plan.projected_speedup() >= 1.2
    assert all("least damage at 1.20x" in d.reason for d in plan.decisions if d.reason.startswith("auto"))


def test_target_speedup_out_of_reach():
    with pytest.raises(Exception, match="target_speedup=50 is out of reach; at most"):
        train_steps(model(), target_speedup=50)


def test_hopper_plans_choose_from_hoppers_menu():
    """On hardware="h100" the menu is BF16 and FP8-block (NVFP4 and MXFP8 are decoded bf16 GEMMs there): auto
    picks FP8-block where its 128-blocks fit (fc2's K) and BF16 elsewhere, calibration measures nothing else, a
    target above FP8-block's at-scale rate is out of reach, and a fixed MXFP8 recipe's plan projects a slowdown."""
    m = model()
    plan = autoprec.plan(train_steps(m, hardware="h100", cost="at_scale")[0])
    assert {d.fmt for d in plan.decisions} == {"bf16", "fp8_block"}
    assert all(d.fmt == "bf16" for d in plan.decisions if int(d.shape[2]) % 128)
    measured = {cand.fmt for stats in planners_of(m)[-1].calibration.stats.values() for cand in stats}
    assert measured == {"bf16", "fp8_block"}
    with pytest.raises(Exception, match=r"target_speedup=1.4 is out of reach; at most 1\.\d\dx"):
        train_steps(model(), hardware="h100", cost="at_scale", target_speedup=1.4)
    text = autoprec.plan(train_steps(model(), recipe="mxfp8", hardware="h100")[0]).summary()
    assert "on h100: 0." in text and "autoprec's decoded sm_90 GEMMs" in text
    assert re.search(r"at scale: 0\.70x", text)


def test_a_plan_says_when_its_cost_table_is_not_the_gpus():
    """Noted in the plan of graphs that run on CUDA (tests/test_gpu_cuda.py checks it there)."""
    assert device_note("h100", (9, 0), "NVIDIA H200") is None
    note = device_note("gb300", (9, 0), "NVIDIA H200")
    assert note == ("running on NVIDIA H200 (sm_90): the projected speedups are for hardware='gb300'; "
                    "hardware='h100' costs it for this GPU")
    assert device_note("gb300", (10, 3), "NVIDIA B300") is None
    assert "hardware='b200' costs it" in device_note("gb300", (10, 0), "NVIDIA B200")
    assert "no cost table describes this GPU's kernels" in device_note("h100", (12, 0), "NVIDIA RTX PRO 6000")


def test_annotate_and_glob_overrides_win():
    m = model()
    autoprec.annotate(m.lm_head, "mxfp8")
    autoprec.annotate(m.blocks[0].mlp.fc1, fprop="bf16", wgrad="nvfp4")
    c, _ = train_steps(m, recipe="nvfp4", overrides={"blocks.1.*": {"dgrad": "mxfp8"}})
    rows = {(d.module, str(d.role), d.index): d for d in autoprec.plan(c).decisions}
    assert {rows["lm_head", r, 0].fmt for r in ("fprop", "dgrad", "wgrad")} == {"mxfp8"}
    assert "override: annotate(Linear)" in rows["lm_head", "fprop", 0].reason
    assert rows["blocks.0.mlp.fc1", "fprop", 0].fmt == "bf16"
    w = rows["blocks.0.mlp.fc1", "wgrad", 0]
    assert (w.fmt, w.rounding, w.rht) == ("nvfp4", "sr", True)  # the pretrain policy's nvfp4 for wgrad
    assert rows["blocks.0.mlp.fc1", "dgrad", 0].reason == "recipe nvfp4"
    d = rows["blocks.1.attn.qkv", "dgrad", 0]
    assert d.fmt == "mxfp8" and d.reason == "override: 'blocks.1.*' dgrad"
    assert rows["blocks.1.attn.qkv", "fprop", 0].fmt == "nvfp4"


def test_override_errors_name_the_culprit():
    with pytest.raises(Exception, match="'block.*.mlp.fc1' matches no module.*closest: .*blocks.0.mlp.fc1"):
        train_steps(model(), recipe="nvfp4", overrides={"block.*.mlp.fc1": "bf16"})
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"overrides\['blocks.\*'\]: unknown format 'fp4'"):
        train_steps(model(), recipe="nvfp4", overrides={"blocks.*": "fp4"})
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown role 'fwd'"):
        train_steps(model(), recipe="nvfp4", overrides={"blocks.*": {"fwd": "bf16"}})
    with pytest.raises(ValueError, match="unknown format 'nvfp5'.*nvfp4"):
        autoprec.annotate(torch.nn.Linear(2, 2), "nvfp5")
    with pytest.raises(ValueError, match="not both"):
        autoprec.annotate(torch.nn.Linear(2, 2), "bf16", wgrad="mxfp8")


def test_plan_json_round_trip_and_reload_skips_calibration(tmp_path):
    m = model()
    c, _ = train_steps(m, steps=2)
    idx, tgt = tokens(batch=4, ctx=16, vocab=64)
    want = c(idx, tgt).detach()  # planned and rewritten by now
    plan = autoprec.plan(c)
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = Plan.load(path)
    assert [d.to_json() for d in loaded.decisions] == [d.to_json() for d in plan.decisions]
    torch._dynamo.reset()
    PLANNERS.clear()
    m2 = copy.deepcopy(m)
    c2 = torch.compile(m2, backend="autoprec", options={"plan": str(path)})
    first = c2(idx, tgt)  # already quantized: no high-precision calibration step
    assert bits_equal(first.detach(), want)
    assert all(d.reason.startswith("plan file") for d in autoprec.plan(c2).decisions)


def test_edited_plan_file(tmp_path):
    c, _ = train_steps(model(), recipe="nvfp4", steps=1)
    path = tmp_path / "plan.json"
    autoprec.plan(c).save(path)
    data = json.loads(path.read_text())
    for d in data["decisions"]:
        if d["module"] == "blocks.0.mlp.fc2":
            d["fmt"], d["reason"] = "bf16", "edited by hand"
    path.write_text(json.dumps(data))
    torch._dynamo.reset()
    PLANNERS.clear()
    c2, _ = train_steps(model(), steps=1, plan=str(path))
    rows = [d for d in autoprec.plan(c2).decisions if d.module == "blocks.0.mlp.fc2"]
    assert rows and all(d.fmt == "bf16" and d.reason == "plan file: edited by hand" for d in rows)


def test_bad_plan_files(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"schema_version": 99, "decisions": []}))
    with pytest.raises(ValueError, match="p.json: schema_version 99"):
        Plan.load(path)
    c, _ = train_steps(model(), recipe="mxfp8", steps=1)
    plan = autoprec.plan(c)
    data = json.loads(json.dumps({"schema_version": 2, "decisions": [d.to_json() for d in plan.decisions]}))
    data["decisions"][0]["module"] = "blocks.0.atn.qkv"
    path.write_text(json.dumps(data))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="module 'blocks.0.atn.qkv' is not in this model; closest: blocks.0.attn.qkv"):
        train_steps(model(), steps=1, plan=str(path))
    data["decisions"][0]["colour"] = "red"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"decision 0 \(blocks.0.atn.qkv \w+\): unknown decision field"):
        Plan.load(path)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="option plan: no plan file at"):  # dynamo wraps backend errors
        train_steps(model(), plan=str(tmp_path / "missing.json"))


def test_rl_trainer_logits_equal_sampler_bit_for_bit():
    base = model()
    idx, _ = tokens(batch=4, ctx=16, vocab=64)
    sampler = torch.compile(copy.deepcopy(base), backend="autoprec", options={"phase": "rl_sampler"})
    with torch.no_grad():
        sampler(idx)  # calibration
        want = sampler(idx)
    sampler_plan = autoprec.plan(sampler)
    assert set(sampler_plan.role_counts().values()) - {0} and sampler_plan.role_counts()["wgrad"] == 0
    trainer = torch.compile(copy.deepcopy(base), backend="autoprec",
                            options={"phase": "rl_trainer", "match": sampler_plan})
    for _ in range(2):  # the calibration step already runs the sampler's forward numerics
        got = trainer(idx)
        assert bits_equal(got.detach(), want)
        got.float().pow(2).mean().backward()
    rows = autoprec.plan(trainer).decisions
    assert all(d.reason.startswith("matched to the rl_sampler plan") for d in rows if str(d.role) == "fprop")
    mismatched = torch.compile(copy.deepcopy(base), backend="autoprec", options={"recipe": "bf16"})
    assert not torch.equal(mismatched(idx).detach(), want)


def test_rl_trainer_needs_match():
    with pytest.raises(ValueError, match="match .* goes with phase='rl_trainer'"):
        autoprec.planner.options.parse_options({"phase": "rl_trainer"})


def test_nvfp4_nvidia_preset():
    torch.manual_seed(0)
    m = TinyGPT(vocab=64, d=64, layers=4, heads=2, ctx=16)
    c, _ = train_steps(m, recipe="nvfp4_nvidia", steps=1)
    rows = autoprec.plan(c).decisions
    for d in rows:
        if d.module.startswith("blocks.3") or d.module == "lm_head":
            assert d.fmt == "bf16", d
        else:
            assert d.fmt == "nvfp4"
            assert d.rht == (str(d.role) == "wgrad")
            assert d.rounding == ("rne" if str(d.role) == "fprop" else "sr")
    weights = [d for d in rows if d.fmt == "nvfp4" and str(d.role) != "wgrad" and d.module.endswith(("qkv", "fc1"))]
    assert weights and all(d.tile2d for d in weights)


def test_table_columns_and_summary():
    """The default view fits a 120-column terminal with short reasons; ``details()`` has every column and reason."""
    c, _ = train_steps(model(), recipe="nvfp4", steps=1)
    plan = autoprec.plan(c)
    text, details = str(plan), plan.details()
    assert text.splitlines()[0].split() == list(SHORT_COLUMNS) and details.splitlines()[0].split() == list(COLUMNS)
    assert max(len(line) for line in text.splitlines()) <= 120
    assert "projected GEMM speedup vs BF16 on gb300" in text and "FLOPs: nvfp4 100%" in text
    assert "pass times: normalize_grouped" in details and "find_matmuls" in details and "rewrite_matmuls" in details
    assert all(d.reason in details for d in plan.decisions)
    assert "plan.details()" in text


def test_default_table_keeps_long_module_names_and_reasons_within_120_columns():
    """A long module path gives way from its start and a long reason is cut, both marked with an ellipsis."""
    long = "model.language_model.layers.11.mixture_of_experts.shared_expert.gate_up_projection"
    d = Decision(site=0, module=long, role=MatmulRole.FPROP, shape=("4096", "8192", "4096"), batch=None,
                 fmt="nvfp4", index=1, rounding="rne", rht=False, tile2d=True,
                 reason="auto (fastest within budget 1.0e-02/GEMM): damage 1.0e-02 " + "x" * 200 + "; others bf16 0")
    lines = str(Plan(decisions=[d])).splitlines()
    assert max(map(len, lines)) <= 120
    assert "fprop#1" in lines[1] and "nvfp4 16x16" in lines[1] and "…" in lines[1]
    assert lines[1].startswith("…") and "expert.gate_up_projection  fprop#1" in lines[1]
    assert "auto: damage 1.0e-02 xxx" in lines[1] and "(fastest" not in lines[1]


def test_cost_model():
    gb300, h100 = HARDWARE["gb300"], HARDWARE["h100"]
    big = (2 * 8192**3, 2 * 8192**2, 8192**2)  # compute-bound
    ratio = gemm_seconds(*big, "bf16", gb300) / gemm_seconds(*big, "nvfp4", gb300)
    assert 5.0 < ratio < 6.0  # 15 / 2.5 PFLOPS, less the quantization's writes
    for fmt in ("nvfp4", "mxfp8"):  # decoded to bf16 for BF16 tensor cores on Hopper: never faster
        assert gemm_seconds(*big, fmt, h100) >= gemm_seconds(*big, "bf16", h100)
    small = (2 * 64**3, 2 * 64**2, 64**2)  # memory-bound: only the bytes shrink
    assert 1.0 < gemm_seconds(*small, "bf16", gb300) / gemm_seconds(*small, "nvfp4", gb300) < 6.0
    assert gemm_seconds(*small, "nvfp4", h100) > gemm_seconds(*small, "bf16", h100)  # decoding adds bytes


def test_plan_follows_the_live_compilation():
    m = model()
    c, _ = train_steps(m, recipe="nvfp4", steps=1)
    assert {d.fmt for d in autoprec.plan(c).decisions} == {"nvfp4"}
    torch._dynamo.reset()
    c2, _ = train_steps(m, recipe="mxfp8", steps=1)
    fmts = {d.fmt for d in autoprec.plan(c2).decisions}
    assert "nvfp4" not in fmts and "mxfp8" in fmts  # the dropped graph's plan is gone
