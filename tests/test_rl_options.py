"""The RL phases' options and plan fields: activation_scale, the phase ``rl``, input_amax in plan files, and a
matched plan that cannot be reproduced under static scales."""
import copy

import pytest
import torch

import autoprec
from autoprec.planner.options import parse_options
from autoprec.planner.plan import Decision, Plan

from gpt_model import TinyGPT, tokens

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_activation_scale_defaults_by_phase_and_is_checked():
    assert not parse_options({}).static_activations
    assert all(parse_options({"phase": p, **({"match": Plan()} if p == "rl_trainer" else {})}).static_activations
               for p in ("rl_sampler", "rl_trainer", "rl"))
    assert not parse_options({"phase": "rl", "activation_scale": "dynamic"}).static_activations
    assert parse_options({"activation_scale": "static"}).static_activations
    with pytest.raises(ValueError, match="activation_scale='row' is not valid; choose from dynamic, static"):
        parse_options({"activation_scale": "row"})
    with pytest.raises(TypeError, match="activation_scale must be a string"):
        parse_options({"activation_scale": 1})


def test_input_amax_round_trips_and_is_checked(tmp_path):
    d = Decision(site=0, module="fc", role="fprop", shape=("8", "4", "16"), batch=None, fmt="nvfp4",
                 input_amax=(3.5, None))
    path = tmp_path / "plan.json"
    Plan(decisions=[d]).save(path)
    assert Plan.load(path).decisions[0].input_amax == (3.5, None)
    with pytest.raises(ValueError, match="field 'input_amax'"):
        Decision(site=0, module="fc", role="fprop", shape=("8", "4", "16"), batch=None, fmt="nvfp4",
                 input_amax=(-1.0, None))


def test_a_dynamic_sampler_plan_cannot_be_matched_under_static_scales():
    base = TinyGPT(vocab=64, d=64, layers=1, heads=2, ctx=16)
    idx, _ = tokens(batch=2, ctx=16, vocab=64)
    sampler = torch.compile(copy.deepcopy(base), backend="autoprec",
                            options={"phase": "rl_sampler", "recipe": "nvfp4", "activation_scale": "dynamic"})
    with torch.no_grad():
        sampler(idx)
    trainer = torch.compile(copy.deepcopy(base), backend="autoprec",
                            options={"phase": "rl_trainer", "match": autoprec.plan(sampler), "recipe": "nvfp4"})
    with pytest.raises(Exception, match="option match: the plan runs 'blocks.0.attn.qkv' fprop in NVFP4 with dynamic"):
        trainer(idx)


def test_static_scales_in_pretraining_are_measured_then_used():
    """``activation_scale="static"`` with a preset calibrates one step (amaxes only), then runs NVFP4 with them."""
    model = torch.compile(TinyGPT(vocab=64, d=64, layers=1, heads=2, ctx=16), backend="autoprec",
                          options={"recipe": "nvfp4", "activation_scale": "static"})
    for step in range(2):
        idx, targets = tokens(batch=2, ctx=16, vocab=64, seed=step)
        model(idx, targets).backward()
    rows = [d for d in autoprec.plan(model).decisions if str(d.role) == "fprop" and d.fmt == "nvfp4"]
    assert rows and all(d.input_amax and d.input_amax[0] > 0 for d in rows)
    assert all(d.input_amax is None for d in autoprec.plan(model).decisions if str(d.role) != "fprop")


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_a_rows_product_does_not_depend_on_how_many_rows_share_it(fmt):
    """The CPU reference product of 1 to 3 rows equals those rows of a bigger product, bit for bit (a decode step's
    expert may get one token): BLAS's few-row path is not taken (``dispatch.ROW_FLOOR``)."""
    from autoprec.kernels.dispatch import dense as dispatch

    gen = torch.Generator().manual_seed(0)
    a, w = torch.randn(64, 512, generator=gen), torch.randn(256, 512, generator=gen)
    amax = torch.tensor(4.0).view(torch.int32)

    def product(rows: torch.Tensor) -> torch.Tensor:
        if fmt == "bf16":
            return dispatch.reference_scaled_mm(rows.bfloat16(), w.t().bfloat16(), None, torch.float32)
        qa = dispatch.quantize(rows, "nvfp4", amax=amax)
        return dispatch.reference_scaled_mm(qa, dispatch.quantize(w.t(), "nvfp4", 0), None, torch.float32)

    full = product(a)
    assert all(torch.equal(product(a[i:i + m]), full[i:i + m]) for m in (1, 2, 3, 5) for i in (0, 7))
