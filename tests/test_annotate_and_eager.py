"""What the plan says about annotations it could not apply and about code dynamo ran eagerly."""
import pytest
import torch
from torch import nn

import autoprec

from gpt_model import MLP

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def step(c, x: torch.Tensor) -> None:
    c(x).sum().backward()


def test_annotation_outside_the_model_is_reported():
    model, stray = MLP(), nn.Linear(32, 32)
    autoprec.annotate(stray, "bf16")
    autoprec.annotate(model, "mxfp8")  # the root itself: covers every GEMM
    c = torch.compile(model, backend="autoprec", options={"recipe": "nvfp4"})
    with pytest.warns(UserWarning, match=r"annotate\(Linear, fprop=bf16, .*not part of any model compiled so far"):
        step(c, torch.randn(4, 16, 32))
    plan = autoprec.plan(c)
    assert {d.fmt for d in plan.decisions} == {"mxfp8"}
    assert any("annotate(Linear, fprop=bf16" in n and "not part of this (or any compiled) model; ignored" in n
               for n in plan.notes)
    assert "ignored" in str(plan)


def test_annotation_on_a_module_without_gemms_is_reported():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.fc = nn.LayerNorm(32), nn.Linear(32, 32)

        def forward(self, x):
            return self.fc(self.norm(x))

    model = Net()
    autoprec.annotate(model.norm, "bf16")
    c = torch.compile(model, backend="autoprec", options={"recipe": "nvfp4"})
    step(c, torch.randn(16, 32))
    assert any("on 'norm': no planned GEMM runs in this module; ignored" in n for n in autoprec.plan(c).notes)


@pytest.mark.parametrize("recipe", ["nvfp4", "auto"])
def test_annotate_after_planning_warns_and_keeps_the_plan(recipe):
    """The rule is the same for presets and auto: an annotation applies to GEMMs planned after it."""
    model = MLP()
    c = torch.compile(model, backend="autoprec", options={"recipe": recipe, "budget": 1.0})
    x = torch.randn(4, 16, 32)
    step(c, x)
    if recipe == "auto":  # the first call calibrated; nothing is planned yet, so this one counts
        autoprec.annotate(model.fc1, "mxfp8")
        step(c, x)
        assert all(d.fmt == "mxfp8" for d in autoprec.plan(c).decisions if d.module == "fc1")
    before = [(d.key, d.fmt) for d in autoprec.plan(c).decisions]
    with pytest.warns(UserWarning, match=r"annotate\(Linear\): GEMMs of this module are already planned"):
        autoprec.annotate(model.fc2, "bf16")
    step(c, x)
    assert [(d.key, d.fmt) for d in autoprec.plan(c).decisions] == before


class LoopedMoE(nn.Module):
    """An expert loop with ``nonzero``: dynamo breaks the graph in the loop and skips the whole frame."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(32, 4)
        self.experts = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))

    def forward(self, x):
        ids = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows = (ids == e).nonzero().squeeze(-1)
            out[rows] = expert(x[rows])
        return out


def test_skipped_frame_says_what_ran_eagerly_and_why():
    c = torch.compile(LoopedMoE(), backend="autoprec")
    step(c, torch.randn(16, 32))
    plan = autoprec.plan(c)
    assert plan.decisions == []
    assert plan.not_compiled == ["router", "experts.0", "experts.1", "experts.2", "experts.3"]
    text = str(plan)
    assert "FLOPs: no GEMM planned" in text
    assert "aten.nonzero.default" in text and "frame skipped: forward" in text


def test_never_called_still_says_call_it():
    with pytest.raises(ValueError, match="call it once"):
        autoprec.plan(torch.compile(MLP(), backend="autoprec"))


def test_annotation_follows_the_instance_after_a_graph_break():
    """Blocks share one compiled graph after a graph break; the annotation holds for its own block only."""
    from gpt_model import TinyGPT, tokens

    model = TinyGPT(graph_break=True)
    autoprec.annotate(model.blocks[1].mlp.fc1, "bf16")
    c = torch.compile(model, backend="autoprec", options={"recipe": "nvfp4"})
    c(*tokens()).backward()
    fmts = {(d.module, d.fmt) for d in autoprec.plan(c).decisions if d.module.endswith("mlp.fc1")}
    assert fmts == {("blocks.0.mlp.fc1", "nvfp4"), ("blocks.1.mlp.fc1", "bf16")}
