"""The at-scale projection: traced GEMMs mapped onto a reference model and costed at Transformer Engine's
measured speedups; the solver can target it (``cost="at_scale"``)."""
import pytest
import torch

import autoprec
from autoprec.planner.at_scale import (
    DECODED_RATE,
    MEASURED,
    SOURCES,
    TE_B300,
    AtScale,
    ReferenceShapes,
    measured_rate,
)
from autoprec.planner.cost import HARDWARE, get_hardware
from autoprec.planner.model_planner import planners_of
from autoprec.planner.options import parse_options

from gpt_model import TinyGPT, tokens

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def planned(options: dict):
    torch.manual_seed(0)
    model = TinyGPT(vocab=64, d=64, layers=2, heads=2, ctx=32)
    c = torch.compile(model, backend="autoprec", options=options)
    for i in range(2):
        c(*tokens(4, 32, 64, seed=i)).backward()
    return c


@pytest.mark.parametrize("recipe", ["bf16", "mxfp8", "nvfp4"])
def test_uniform_plans_project_the_measured_rates(recipe):
    plan = autoprec.plan(planned({"recipe": recipe}))
    assert plan.projected_speedup(at_scale=True) == pytest.approx(TE_B300[recipe])
    assert "at scale: " in plan.summary() and "d_model 4096, ffn 16384, 15872 tokens" in plan.summary()


def test_every_cost_table_has_measured_rates_and_names_them():
    assert set(MEASURED) == set(SOURCES) == set(HARDWARE)
    for name, rates in MEASURED.items():
        assert set(rates) == {"bf16", "mxfp8", "nvfp4"} | ({"fp8_block"} if name == "h100" else set())
        assert rates["bf16"] == 1.0
        assert all(f"{fmt.upper()} {rate:.2f}x" in SOURCES[name] for fmt, rate in rates.items() if fmt != "bf16")
    # a format no table measures on a hardware that decodes it (FP8-block on Blackwell): the decoded rate, unlisted
    assert measured_rate("gb300", "fp8_block") == DECODED_RATE and "FP8_BLOCK" not in SOURCES["gb300"]
    assert measured_rate("gb300", "mxfp8_e5m2") == TE_B300["mxfp8"]


def test_traced_widths_map_onto_the_reference_model():
    c = planned({"recipe": "bf16"})
    specs = list(planners_of(c._orig_mod)[-1].specs.values())
    proj = AtScale(specs, ReferenceShapes(), get_hardware("gb300"))
    assert (proj.d, proj.ffn, proj.tokens, proj.seq) == (64, 256, 128, 32)
    fc1 = next(s for s in specs if s.key == ("blocks.0.mlp.fc1", "fprop", 0))
    assert proj.flops(fc1) == 2.0 * 15872 * 16384 * 4096  # tokens x ffn x d_model at the reference
    qkv = next(s for s in specs if s.key == ("blocks.0.attn.qkv", "fprop", 0))
    assert proj.flops(qkv) == 2.0 * 15872 * 3 * 4096 * 4096


def test_solver_can_target_the_at_scale_speedup():
    """Tiny GEMMs are memory-bound: their roofline cannot reach 1.6x, the reference shapes can."""
    with pytest.raises(Exception, match="target_speedup=1.6 is out of reach"):
        planned({"target_speedup": 1.6})
    torch._dynamo.reset()
    plan = autoprec.plan(planned({"target_speedup": 1.6, "cost": "at_scale"}))
    assert 1.6 <= plan.projected_speedup(at_scale=True) < 2.03


@pytest.mark.parametrize("options,match", [
    ({"cost": "peak"}, "option cost='peak' is not valid; choose from roofline, at_scale"),
    ({"reference_shapes": {"hidden": 4096}}, "unknown key 'hidden'; valid: d_model, ffn, tokens, seq"),
    ({"reference_shapes": {"tokens": 0}}, r"reference_shapes\['tokens'\] must be a positive int"),
])
def test_bad_cost_options_name_themselves(options, match):
    with pytest.raises(ValueError, match=match):
        parse_options(options)
