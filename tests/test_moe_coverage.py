"""Mixture-of-experts models: the expert GEMMs autoprec does not plan yet are counted and named, never
hidden behind a 100% share of the GEMMs it did plan."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autoprec

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class GroupedMoE(nn.Module):
    """A router and experts run with ``F.grouped_mm`` over token groups (offsets)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 32)
        self.router = nn.Linear(32, 4)
        self.experts = nn.Parameter(torch.randn(4, 32, 32) * 0.1)

    def forward(self, idx):
        x = self.emb(idx)
        offs = torch.tensor([4, 8, 12, 16], dtype=torch.int32)
        return F.grouped_mm(x, self.experts, offs=offs) * self.router(x).softmax(-1).amax(-1, keepdim=True)


def test_grouped_mm_is_counted_and_named():
    c = torch.compile(GroupedMoE().bfloat16(), backend="autoprec", options={"recipe": "nvfp4"})
    with torch.no_grad():
        c(torch.arange(16))
    plan = autoprec.plan(c)
    share = plan.flop_share()
    assert share["not planned"] > 0.5 and share["nvfp4"] < 0.5
    text = str(plan)
    assert "FLOPs: not planned" in text and "aten._grouped_mm" in text
    assert ("experts", "op not supported: aten._grouped_mm") in plan.unplanned_params
    assert ("emb.weight", "not a matmul (e.g. an embedding table)") in plan.unplanned_params


transformers = pytest.importorskip("transformers")


def mixtral(impl: str | None) -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=64)
    kw = {"experts_implementation": impl} if impl else {}
    return transformers.MixtralForCausalLM._from_config(cfg, **kw)


def test_mixtral_default_experts_are_not_hidden():
    """transformers' grouped-mm custom op is not planned yet: the plan says so, with the expert weights."""
    c = torch.compile(mixtral(None), backend="autoprec", options={"recipe": "nvfp4"})
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(2):
        out = c(input_ids=ids, labels=ids)
        out.loss.backward()
        losses.append(out.loss.item())
    plan = autoprec.plan(c)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert plan.flop_share().get("not planned", 0) > 0.2
    experts = [p for p, why in plan.unplanned_params if "experts" in p]
    assert experts and all("op not supported: transformers.grouped_mm" in why
                           for p, why in plan.unplanned_params if "experts" in p)
    assert any(d.module == "model.layers.0.mlp.gate" for d in plan.decisions)  # the router is planned
