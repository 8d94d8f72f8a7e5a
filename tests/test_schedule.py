"""Precision schedules: the plan switches phases at training steps (backward passes), each phase's
numerics are a fresh compile's with that phase's plan, the SR counter runs on across the switch, and a
resumed run continues in its phase."""
import copy

import pytest
import torch

import autoprec
from autoprec.options import parse_options

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


def test_phase_switch_matches_a_fresh_compile_of_the_later_plan(tmp_path):
    model = gpt()
    c = torch.compile(model, backend="autoprec", options={"recipe": "nvfp4_nvidia", "schedule": TAIL})
    for i in range(2):
        step(c, model, i)
    assert "running now" in autoprec.plan(c).schedule[0] and autoprec.plan(c).schedule[1].endswith("x")
    step(c, model, 2)  # the third backward pass: phase 1 runs from the next step
    assert "running now" in autoprec.plan(c).schedule[1]
    snapshot, counter = copy.deepcopy(model.state_dict()), autoprec.state_dict(c)
    after = [step(c, model, i) for i in (3, 4)]
    plan = autoprec.plan(c)
    fprop = [d for d in plan.decisions if str(d.role) == "fprop"]
    assert all(d.fmt == "bf16" for d in fprop) and "schedule from step 3: override: '*' fprop" in fprop[0].reason
    assert {d.fmt for d in autoprec.plan(c, phase=0).decisions if str(d.role) == "fprop"} == {"nvfp4", "bf16"}
    assert "schedule phase 1 from step 3" in str(plan) and counter["train_steps"] == 3
    plan.save(tmp_path / "phase1.json")

    fresh = gpt()
    fresh.load_state_dict(snapshot)
    f = torch.compile(fresh, backend="autoprec",
                      options={"recipe": "nvfp4_nvidia", "plan": str(tmp_path / "phase1.json")})
    autoprec.load_state_dict(fresh, {"calls": counter["calls"], "plan": None})
    assert [step(f, fresh, i) for i in (3, 4)] == after  # bit for bit, SR bits included
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))


def test_resumed_run_continues_in_its_phase():
    model = gpt()
    c = torch.compile(model, backend="autoprec", options={"recipe": "nvfp4", "schedule": TAIL})
    autoprec.load_state_dict(model, {"calls": 7, "train_steps": 5, "plan": None})
    step(c, model, 0)
    assert all(d.fmt == "bf16" for d in autoprec.plan(c).decisions if str(d.role) == "fprop")


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
