"""Precision schedules: the plan switches stages at training steps (backward passes), each stage's
numerics are a fresh compile's with that stage's plan, the SR counter runs on across the switch, and a
resumed run continues in its stage."""
import copy

import pytest
import torch

import autoprec
from autoprec.planner.options import parse_options

from gpt_model import TinyGPT, tokens

pytestmark = pytest.mark.usefixtures("fresh_dynamo")
TAIL = [{"from_step": 3, "overrides": {"*": {"fprop": "bf16"}}}]  # NVIDIA's forward-in-BF16 tail


def gpt() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(vocab=64, d=32, layers=2, heads=2, ctx=16)


def step(c, model, i: int) -> float:
    """One SGD step (no optimizer state: a copy of the weights is the whole training state)."""
    loss = c(*tokens(2, 16, 64, seed=i))
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
            p.grad = None
    return loss.item()


def test_stage_switch_matches_a_fresh_compile_of_the_later_plan(tmp_path):
    model = gpt()
    c = torch.compile(model, backend="autoprec", options={"recipe": "nvfp4_nvidia", "schedule": TAIL})
    for i in range(2):
        step(c, model, i)
    assert "running now" in autoprec.plan(c).schedule[0] and autoprec.plan(c).schedule[1].endswith("x")
    step(c, model, 2)  # the third backward pass: stage 1 runs from the next step
    assert "running now" in autoprec.plan(c).schedule[1]
    snapshot, counter = copy.deepcopy(model.state_dict()), autoprec.state_dict(c)
    after = [step(c, model, i) for i in (3, 4)]
    plan = autoprec.plan(c)
    fprop = [d for d in plan.decisions if str(d.role) == "fprop"]
    assert all(d.fmt == "bf16" for d in fprop) and "schedule from step 3: override: '*' fprop" in fprop[0].reason
    assert {d.fmt for d in autoprec.plan(c, stage=0).decisions if str(d.role) == "fprop"} == {"nvfp4", "bf16"}
    assert autoprec.plan(c, phase=0).decisions == autoprec.plan(c, stage=0).decisions  # the older keyword
    assert "schedule stage 1 from step 3" in str(plan) and counter["train_steps"] == 3
    plan.save(tmp_path / "phase1.json")

    fresh = gpt()
    fresh.load_state_dict(snapshot)
    f = torch.compile(fresh, backend="autoprec",
                      options={"recipe": "nvfp4_nvidia", "plan": str(tmp_path / "phase1.json")})
    autoprec.load_state_dict(fresh, {"calls": counter["calls"], "plan": None})
    assert [step(f, fresh, i) for i in (3, 4)] == after  # bit for bit, SR bits included
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))


def test_resumed_run_continues_in_its_stage():
    model = gpt()
    c = torch.compile(model, backend="autoprec", options={"recipe": "nvfp4", "schedule": TAIL})
    autoprec.load_state_dict(model, {"calls": 7, "train_steps": 5, "plan": None})
    step(c, model, 0)
    assert all(d.fmt == "bf16" for d in autoprec.plan(c).decisions if str(d.role) == "fprop")


def test_resumed_run_counts_on_from_its_step():
    model = gpt()
    c = torch.compile(model, backend="autoprec", options={"recipe": "nvfp4", "schedule": TAIL})
    autoprec.load_state_dict(model, {"calls": 2, "train_steps": 1, "plan": None})
    step(c, model, 0)
    assert "running now" in autoprec.plan(c).schedule[0]
    step(c, model, 1)  # the third step: stage 1 from the next one
    assert "running now" in autoprec.plan(c).schedule[1] and autoprec.state_dict(c)["train_steps"] == 3


@pytest.mark.parametrize("schedule,match", [
    ({"from_step": 3}, "must be a list"),
    ([{"from_step": 3}], "exactly the keys from_step, overrides"),
    ([{"from_step": 0, "overrides": {}}], "from_step must be an int greater than 0"),
    ([{"from_step": 5, "overrides": {}}, {"from_step": 5, "overrides": {}}], r"schedule\[1\]: from_step"),
    ([{"from_step": 5, "overrides": {"*": {"forward": "bf16"}}}], "unknown role 'forward'"),
])
def test_bad_schedules_name_the_option(schedule, match):
    with pytest.raises((ValueError, TypeError), match=match):
        parse_options({"schedule": schedule})


def test_schedule_glob_must_match_a_module():
    with pytest.raises(Exception, match="'blocks.9.\\*' matches no module"):
        schedule = [{"from_step": 1, "overrides": {"blocks.9.*": "bf16"}}]
        c = torch.compile(gpt(), backend="autoprec", options={"recipe": "nvfp4", "schedule": schedule})
        c(*tokens(2, 16, 64))


def test_recalibration_re_solves_and_matches_a_fresh_compile(tmp_path):
    """recalibrate_every=3: steps 1 and 4 run as traced while measuring; from step 5 on the model runs the
    re-solved plan, bit-identical to a fresh compile of it started from the same weights and counter."""
    model = gpt()
    opts = {"recipe": "auto", "budget": 0.004, "recalibrate_every": 3}
    c = torch.compile(model, backend="autoprec", options=opts)
    for i in range(2):
        step(c, model, i)
    first = {d.key: d.err for d in autoprec.plan(c).decisions}
    assert "these rows are the first plan" in autoprec.plan(c).schedule[0]
    step(c, model, 2)
    x, y = tokens(2, 16, 64, seed=3)
    with torch.no_grad():
        exact = model(x, y).item()
    assert step(c, model, 3) == pytest.approx(exact, rel=1e-6)  # the measuring step runs as traced
    assert "measuring now" in autoprec.plan(c).schedule[0]
    snapshot, counter = copy.deepcopy(model.state_dict()), autoprec.state_dict(c)
    after = [step(c, model, 4)]
    plan = autoprec.plan(c)
    assert "re-calibrates every 3 training steps" in str(plan) and "after step 3" in plan.schedule[0]
    assert {d.key for d in plan.decisions} == set(first) and any(d.err != first[d.key] for d in plan.decisions)
    assert "nvfp4" in plan.flop_share()
    plan.save(tmp_path / "second.json")
    after.append(step(c, model, 5))
    assert "measuring now, in the step after step 6" in autoprec.plan(c).schedule[0]

    fresh = gpt()
    fresh.load_state_dict(snapshot)
    f = torch.compile(fresh, backend="autoprec", options={"recipe": "auto", "plan": str(tmp_path / "second.json")})
    autoprec.load_state_dict(fresh, {"calls": counter["calls"], "plan": None})
    assert [step(f, fresh, i) for i in (4, 5)] == after  # bit for bit, SR bits included
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))


def test_resumed_run_keeps_its_plan_until_the_next_recalibration():
    model = gpt()
    opts = {"recipe": "auto", "budget": 0.004, "recalibrate_every": 3}
    c = torch.compile(model, backend="autoprec", options=opts)
    for i in range(2):
        step(c, model, i)
    state = autoprec.state_dict(c)
    resumed = gpt()
    resumed.load_state_dict(model.state_dict())
    autoprec.load_state_dict(resumed, state)
    r = torch.compile(resumed, backend="autoprec", options=opts)
    assert step(r, resumed, 2) == step(c, model, 2)  # the restored plan runs at once, as the original did
    x, y = tokens(2, 16, 64, seed=3)
    with torch.no_grad():
        exact = resumed(x, y).item()
    assert step(r, resumed, 3) == pytest.approx(exact, rel=1e-6)  # after step 3: measuring
    step(r, resumed, 4)
    assert "after step 3" in autoprec.plan(r).schedule[0]
    assert all("load_state_dict" not in d.reason for d in autoprec.plan(r).decisions)


@pytest.mark.parametrize("options,error,match", [
    ({"recalibrate_every": 0}, ValueError, "recalibrate_every must be >= 1"),
    ({"recalibrate_every": "10"}, TypeError, "recalibrate_every must be an int or None"),
    ({"recipe": "nvfp4", "recalibrate_every": 10}, ValueError, "recalibrate_every needs recipe='auto'"),
])
def test_bad_recalibration_options_name_the_option(options, error, match):
    with pytest.raises(error, match=match):
        parse_options(options)
