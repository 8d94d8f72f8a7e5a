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


def moe_model(kind: str, impl: str | None) -> nn.Module:
    """Mixtral or Qwen3-MoE from a tiny config, with transformers' default, batched_mm or eager experts."""
    torch.manual_seed(0)
    common = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                  max_position_embeddings=64, num_experts_per_tok=2)
    if kind == "mixtral":
        cfg, cls = transformers.MixtralConfig(intermediate_size=64, num_local_experts=4, **common), \
            transformers.MixtralForCausalLM
    else:
        cfg = transformers.Qwen3MoeConfig(intermediate_size=64, moe_intermediate_size=32, num_experts=4, head_dim=32,
                                          **common)
        cls = transformers.Qwen3MoeForCausalLM
    return cls._from_config(cfg, **({"experts_implementation": impl} if impl else {}))


@pytest.mark.parametrize("impl", [None, "batched_mm", "eager"], ids=["default", "batched_mm", "eager"])
@pytest.mark.parametrize("kind", ["mixtral", "qwen3_moe"])
def test_hf_moe_trains_and_says_what_it_planned(kind, impl):
    """nvfp4_nvidia (16x16 tiles: the 4-expert router falls back to 1x16) trains every experts path; the plan
    names what it did not plan: the grouped-mm op, the gathered expert weights, the eager expert loop."""
    model = moe_model(kind, impl)
    c = torch.compile(model, backend="autoprec", options={"recipe": "nvfp4_nvidia"})
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(0, 16, (4, 16), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(3):
        opt.zero_grad()
        out = c(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    plan = autoprec.plan(c)
    router = [d for d in plan.decisions if d.module == "model.layers.0.mlp.gate" and str(d.role) == "fprop"]
    assert router and not router[0].tile2d
    whys = {why for p, why in plan.unplanned_params if "experts" in p}
    if impl is None:
        assert plan.flop_share().get("not planned", 0) > 0.1
        assert whys and all(w.startswith("op not supported: transformers.grouped_mm") for w in whys)
    elif impl == "batched_mm":
        assert whys == {"read through an index (gathered expert weights): its products are planned, "
                        "but not as a weight"}
    else:
        assert "model.layers.0.mlp.experts" in plan.not_compiled and any("frame skipped" in n or "nonzero" in n
                                                                         for n in plan.notes)
