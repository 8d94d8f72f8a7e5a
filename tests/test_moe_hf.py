"""transformers' Mixtral and Qwen3-MoE from tiny configs (no downloads) with each experts implementation:
``grouped_mm`` (the default; fp32 models go through transformers' own grouped-mm op, bf16 ones through
``aten._grouped_mm``), ``batched_mm`` (bmm over gathered expert weights) and ``eager`` (a per-expert loop
that breaks the graph). The default run covers every implementation and every recipe once; the full
matrix is marked slow (``pytest -m slow``)."""
import itertools

import pytest
import torch

import autoprec

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("fresh_dynamo")

IMPLS = ["default", "default_bf16", "batched_mm", "eager"]
RECIPES = ["bf16", "mxfp8", "nvfp4", "nvfp4_nvidia", "auto"]
# one recipe per (model, implementation) in the default run, so that each recipe meets each path kind
FAST = [("mixtral", "default", "auto"), ("mixtral", "default_bf16", "nvfp4_nvidia"), ("mixtral", "batched_mm", "mxfp8"),
        ("mixtral", "eager", "nvfp4"), ("qwen3_moe", "default", "nvfp4_nvidia"), ("qwen3_moe", "default_bf16", "auto"),
        ("qwen3_moe", "batched_mm", "nvfp4"), ("qwen3_moe", "eager", "bf16"), ("qwen3_moe", "default", "mxfp8")]
SLOW = [pytest.param(*c, marks=pytest.mark.slow) for c in itertools.product(["mixtral", "qwen3_moe"], IMPLS, RECIPES)
        if c not in FAST]


def moe_model(kind: str, impl: str) -> torch.nn.Module:
    """A 2-layer model with 4 experts, top-2 routing, hidden size 64."""
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
    experts = {"batched_mm": "batched_mm", "eager": "eager"}.get(impl)
    model = cls._from_config(cfg, **({"experts_implementation": experts} if experts else {}))
    return model.bfloat16() if impl == "default_bf16" else model


@pytest.mark.parametrize("kind,impl,recipe", FAST + SLOW)
def test_hf_moe_trains_and_plans_its_experts(kind, impl, recipe):
    model = moe_model(kind, impl)
    c = torch.compile(model, backend="autoprec", options={"recipe": recipe})
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(0, 16, (4, 16), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(4):
        opt.zero_grad()
        out = c(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert all(map(torch.isfinite, torch.tensor(losses))) and losses[-1] < losses[0]
    plan, text = autoprec.plan(c), str(autoprec.plan(c))
    router = [d for d in plan.decisions if d.module == "model.layers.0.mlp.gate" and str(d.role) == "fprop"]
    assert router and not router[0].tile2d  # 4 experts: no 16x16 tiles for the router's weight
    experts = [d for d in plan.decisions if d.module == "model.layers.0.mlp.experts"]
    unplanned = {why for p, why in plan.unplanned_params if "experts" in p}
    if impl.startswith("default"):  # grouped GEMMs: planned per experts module, every role
        assert sorted({str(d.role) for d in experts}) == ["dgrad", "fprop", "wgrad"]
        assert all(d.groups == 4 for d in experts) and not unplanned and "not planned" not in plan.flop_share()
        assert "experts model.layers.0.mlp.experts: 4 experts" in text
        if recipe == "auto":
            assert all(sum(d.group_tokens) == 4 * 16 * 2 for d in experts)  # tokens x top-2
        elif recipe != "bf16":
            assert {d.fmt for d in experts if "block 1 is in the last" not in d.reason} == {recipe[:5]}
    elif impl == "batched_mm":  # products over gathered weights are planned; the weights are named
        assert {str(d.role) for d in experts} >= {"fprop", "dgrad"}
        assert unplanned == {"read through an index (gathered expert weights): its products are planned, "
                             "but not as a weight"}
    else:  # the per-expert loop breaks the graph: eager, named, and not in the shares
        assert "model.layers.0.mlp.experts" in plan.not_compiled and not experts
        assert unplanned == {"ran eagerly (after a graph break or in a skipped frame): its GEMMs are not seen"}
        assert "the shares cover compiled graphs only" in text
