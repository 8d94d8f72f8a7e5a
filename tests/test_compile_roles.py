"""Compiler analysis: every matmul found, its role by dataflow, its module, in every graph kind."""
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import autoprec

from gpt_model import MLP, TinyGPT, tokens

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def counts(plan) -> tuple[int, int, int]:
    c = plan.role_counts()
    return c["fprop"], c["dgrad"], c["wgrad"]


def compiled(model, **options):
    return torch.compile(model, backend="autoprec", options=options or None)


def test_mlp_roles_and_names():
    m = compiled(MLP(), recipe="nvfp4")
    m(torch.randn(4, 16, 32)).sum().backward()
    plan = autoprec.plan(m)
    assert counts(plan) == (2, 1, 2)  # the first layer's input needs no gradient: no dgrad
    rows = {(d.module, str(d.role)): d for d in plan.decisions}
    assert set(rows) == {("fc1", "fprop"), ("fc1", "wgrad"), ("fc2", "fprop"), ("fc2", "dgrad"), ("fc2", "wgrad")}
    assert rows["fc1", "fprop"].shape == ("64", "64", "32")  # tokens x out x in
    assert rows["fc1", "wgrad"].shape == ("64", "32", "64")  # out x in x tokens
    assert rows["fc2", "dgrad"].shape == ("64", "64", "32")
    assert len({d.site for d in plan.decisions if d.module == "fc2"}) == 1


def test_gpt_with_explicit_attention_and_tied_lm_head():
    m = compiled(TinyGPT(), recipe="mxfp8")
    m(*tokens()).backward()
    plan = autoprec.plan(m)
    # per block: qkv, proj, fc1, fc2 (3 GEMMs each) + q·kᵀ and p·v (fprop + 2 dgrad each); + lm_head
    assert counts(plan) == (2 * 6 + 1, 2 * 8 + 1, 2 * 4 + 1)
    attn = [d for d in plan.decisions if d.module == "blocks.1.attn"]
    assert sorted(str(d.role) for d in attn) == ["dgrad"] * 4 + ["fprop"] * 2
    assert all(d.batch == "4" for d in attn)
    assert {str(d.role) for d in plan.decisions if d.module == "lm_head"} == {"fprop", "dgrad", "wgrad"}
    assert plan.not_compiled == []


def test_fused_sdpa_stays_bf16_and_is_listed():
    m = compiled(TinyGPT(sdpa=True), recipe="nvfp4")
    m(*tokens()).backward()
    plan = autoprec.plan(m)
    sdpa = [d for d in plan.decisions if d.module.endswith("attn")]
    assert len(sdpa) == 4 and all(d.fmt == "bf16" and not d.rewritten for d in sdpa)
    assert all("scaled_dot_product_attention" in d.reason for d in sdpa)
    assert counts(plan) == (9 + 2, 9 + 2, 9)


def test_graph_break_names_every_instance():
    model = TinyGPT(graph_break=True)
    m = compiled(model, recipe="nvfp4")
    m(*tokens()).backward()
    plan = autoprec.plan(m)
    names = {d.module for d in plan.decisions}
    assert {"blocks.0.attn.qkv", "blocks.1.attn.qkv", "blocks.0.mlp.fc2", "blocks.1.mlp.fc2"} <= names
    assert counts(plan) == (12, 16, 8)
    # a graph break in the block loop leaves the root frame eager: its embeddings and head
    assert plan.not_compiled == ["wte", "wpe", "lm_head"]
    assert "ran outside autoprec" in str(plan) and "dynamo ran code eagerly: " in str(plan)


def test_dynamic_batch_size():
    m = compiled(MLP(), recipe="nvfp4")
    for batch in (2, 3, 5):
        x = torch.randn(batch, 16, 32)
        torch._dynamo.mark_dynamic(x, 0)
        m(x).sum().backward()
    plan = autoprec.plan(m)
    wgrad = [d for d in plan.decisions if str(d.role) == "wgrad"]
    assert wgrad and all(d.fmt == "nvfp4" and "s" in d.shape[2] for d in wgrad)  # K = 16·batch, symbolic
    assert all(d.flops_expr.startswith("65536*s") for d in wgrad)  # 2·64·32·(16·s)
    assert all(d.graphs == ("train0",) for d in plan.decisions)  # one graph for every batch size


def test_dynamic_odd_reduction_falls_back():
    m = compiled(MLP(), recipe="nvfp4")
    x = torch.randn(3, 7, 32)
    torch._dynamo.mark_dynamic(x, 0)
    m(x).sum().backward()
    plan = autoprec.plan(m)
    for d in plan.decisions:
        if str(d.role) == "wgrad":
            assert d.fmt == "bf16" and "not provably a multiple" in d.reason
        else:
            assert d.fmt == "nvfp4"


def test_no_grad_graph_has_fprop_only():
    m = compiled(TinyGPT(), recipe="nvfp4")
    with torch.no_grad():
        m(*tokens())
    plan = autoprec.plan(m)
    assert counts(plan) == (13, 0, 0)
    assert all(d.graphs == ("infer0",) for d in plan.decisions) and not plan.saved_bytes


def test_functional_forms():
    w = torch.nn.Parameter(torch.randn(48, 32))

    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = w

        def forward(self, x):
            a = x @ self.w.t()  # matmul of a 3D input
            b = F.linear(x, self.w)
            c = torch.einsum("btk,btn->bkn", x, a)  # lowers to bmm
            return a.sum() + b.sum() + c.sum()

    m = compiled(Mixed(), recipe="mxfp8")
    m(torch.randn(2, 32, 32, requires_grad=True)).backward()
    plan = autoprec.plan(m)
    assert counts(plan) == (3, 4, 2)
    assert sum(d.batch is not None for d in plan.decisions) == 3


def test_unknown_option_and_bad_values():
    x = torch.randn(4, 32)
    with pytest.raises(Exception, match="unknown autoprec option 'recpie'.*recipe"):
        compiled(MLP(), recpie="nvfp4")(x)
    torch._dynamo.reset()
    valid = "auto, bf16, mxfp8, nvfp4, nvfp4_nvidia"
    with pytest.raises(Exception, match=f"recipe=.fp4. is not valid; choose from {valid}"):
        compiled(MLP(), recipe="fp4")(x)


def test_plan_before_compile_raises():
    with pytest.raises(ValueError, match="no autoprec plan for this MLP"):
        autoprec.plan(MLP())


def test_backend_string_works_without_importing_autoprec():
    code = (
        "import torch, sys\n"
        "m = torch.nn.Linear(32, 16)\n"
        "y = torch.compile(m, backend='autoprec')(torch.randn(4, 32))\n"
        "assert 'autoprec' in sys.modules and y.shape == (4, 16)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
