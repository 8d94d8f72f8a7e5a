"""A pass whose internal invariant breaks does not abort compilation: the GEMM (or the graph) runs
unplanned and the plan says why."""
import pytest
import torch
from torch import nn

import autoprec
import autoprec.pipeline

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class GatheredExperts(nn.Module):
    """transformers' batched_mm expert path in small: each token's expert weight is ``w[expert_id]``."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(32, 4)
        self.w = nn.Parameter(torch.randn(4, 32, 32) * 0.1)

    def forward(self, x):
        logits = self.router(x)
        y = torch.bmm(x.unsqueeze(1), self.w[logits.argmax(-1)]).squeeze(1)
        return y * logits.softmax(-1).amax(-1, keepdim=True)


def test_wgrad_of_a_gathered_weight_runs_bf16_with_reason():
    c = torch.compile(GatheredExperts(), backend="autoprec", options={"recipe": "nvfp4"})
    x = torch.randn(16, 32)
    for _ in range(2):
        c(x).sum().backward()
    rows = [d for d in autoprec.plan(c).decisions if "gathered weight" in d.reason]
    assert len(rows) == 1 and str(rows[0].role) == "wgrad" and rows[0].fmt == "bf16"
    assert {d.fmt for d in autoprec.plan(c).decisions if d.module == "router"} == {"nvfp4"}
    assert autoprec.plan(c).unplanned_params == [("w", "read through an index (gathered expert weights): its "
                                                        "products are planned, but not as a weight")]


def test_failing_pass_leaves_the_graph_as_traced(monkeypatch):
    def broken(infos):
        raise AssertionError("invariant broken")

    monkeypatch.setattr(autoprec.pipeline, "group_sites", broken)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 16))
    x = torch.randn(8, 32)
    want = model(x)
    c = torch.compile(model, backend="autoprec", options={"recipe": "nvfp4"})
    with pytest.warns(UserWarning, match="autoprec pass 'group_sites' failed: AssertionError: invariant broken"):
        got = c(x)
    got.sum().backward()
    assert torch.equal(got, want)
    plan = autoprec.plan(c)
    assert plan.decisions == [] and plan.not_compiled == ["0", "2"]
    assert any("ran as traced, without autoprec's formats" in n for n in plan.notes)
