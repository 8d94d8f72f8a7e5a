"""Recipe auto on extreme data: NaN/Inf, huge and tiny scales, empty batches."""
import pytest
import torch
from torch import nn

import autoprec

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def mlp(act: bool = True, bias: bool = True) -> nn.Module:
    torch.manual_seed(0)
    act_fn = nn.GELU() if act else nn.Identity()
    return nn.Sequential(nn.Linear(64, 64, bias=bias), act_fn, nn.Linear(64, 32, bias=bias))


def run(model: nn.Module, x: torch.Tensor, steps: int = 2, **options) -> autoprec.Plan:
    c = torch.compile(model, backend="autoprec", options=options)
    for _ in range(steps):
        c(x).sum().backward()
    return autoprec.plan(c)


def data(scale: float = 1.0) -> torch.Tensor:
    return torch.randn(32, 64, generator=torch.Generator().manual_seed(1)) * scale


@pytest.mark.parametrize("where", ["input", "weight"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_calibration_gives_bf16_with_reason(where, bad):
    model, x = mlp(), data()
    if where == "input":
        x[3, 5] = bad
    else:
        with torch.no_grad():
            model[0].weight[2, 7] = bad
    plan = run(model, x)
    first = [d for d in plan.decisions if d.module == "0" and str(d.role) == "fprop"][0]
    assert first.fmt == "bf16" and "calibration saw NaN/Inf in operand" in first.reason
    assert all(d.fmt == "bf16" for d in plan.decisions if "NaN/Inf" in d.reason)
    assert "NaN/Inf" in str(plan)


def nvfp4_errors(scale: float) -> dict:
    # linear and bias-free, so only the scale changes; a huge budget: every GEMM takes NVFP4
    plan = run(mlp(act=False, bias=False), data(scale), budget=1e9)
    assert all(d.fmt == "nvfp4" for d in plan.decisions)
    return {d.key: d.err for d in plan.decisions}


def test_errors_do_not_depend_on_the_data_scale():
    """The NVFP4 error of a GEMM does not depend on the data's scale (up to the E4M3 scale roundings,
    which move with it): no overflow at 1e20, no underflow at 1e-25."""
    base = nvfp4_errors(1.0)
    assert all(e > 1e-3 for e in base.values())
    for scale in (1e20, 1e-25):
        torch._dynamo.reset()
        got = nvfp4_errors(scale)
        for key, e in base.items():
            assert e / 2 < got[key] < 2 * e, (scale, key)


def test_tiny_scale_is_not_planned_as_free():
    plan = run(mlp(bias=False), data(1e-30), budget=0.01)
    assert all(d.err is None or d.err > 0 for d in plan.decisions)
    fprop = [d for d in plan.decisions if str(d.role) == "fprop"]
    assert all(d.fmt != "nvfp4" or d.err > 1e-3 for d in fprop)


@pytest.mark.parametrize("recipe", ["auto", "nvfp4", "mxfp8", "nvfp4_nvidia"])
def test_empty_batch(recipe):
    """Empty in, empty out; auto that only saw empty batches runs BF16 and says why."""
    c = torch.compile(mlp(), backend="autoprec", options={"recipe": recipe})
    x = torch.empty(0, 64, requires_grad=True)
    for _ in range(2):
        y = c(x)
        y.sum().backward()
        assert y.shape == (0, 32) and x.grad.shape == (0, 64)
    plan = autoprec.plan(c)
    if recipe == "auto":
        assert all(d.fmt == "bf16" and "no calibration data (empty batches only" in d.reason for d in plan.decisions)
