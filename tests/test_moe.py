"""Mixture-of-experts: grouped expert GEMMs are found, planned per experts module and run quantized
(bit-exact with kernels/dispatch/grouped_mm.py), in a plain-torch block and in transformers' Mixtral and Qwen3-MoE
with each experts implementation; what autoprec cannot plan is named, never hidden in the shares."""
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autoprec
from autoprec.kernels.dispatch.grouped_mm import grouped_mm
from autoprec.planner.cost import get_hardware
from autoprec.planner.model_planner import planners_of

pytestmark = pytest.mark.usefixtures("fresh_dynamo")
RECIPES = ["bf16", "mxfp8", "nvfp4", "nvfp4_nvidia", "auto"]


class Experts(nn.Module):
    """Experts as 3D parameters run with ``F.grouped_mm`` over token groups (a SwiGLU-free MLP)."""

    def __init__(self, n: int, d: int, h: int) -> None:
        super().__init__()
        self.w_in = nn.Parameter(torch.randn(n, d, h) * d ** -0.5)
        self.w_out = nn.Parameter(torch.randn(n, h, d) * h ** -0.5)

    def forward(self, x, offs):
        return F.grouped_mm(F.gelu(F.grouped_mm(x, self.w_in, offs=offs)), self.w_out, offs=offs)


class MoEBlock(nn.Module):
    """Top-1 routing: tokens sorted by expert, group offsets from their counts, outputs scattered back."""

    def __init__(self, n: int = 4, d: int = 32, h: int = 64, vocab: int = 16) -> None:
        super().__init__()
        self.emb, self.router, self.experts = nn.Embedding(vocab, d), nn.Linear(d, n), Experts(n, d, h)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.emb(idx)
        probs = self.router(x).float().softmax(-1)
        top, e = probs.max(-1)
        order = torch.sort(e, stable=True).indices
        offs = torch.bincount(e, minlength=probs.shape[-1]).cumsum(0).to(torch.int32)
        y = torch.empty_like(x).index_copy(0, order, self.experts(x[order], offs))
        return self.head(x + y * top.unsqueeze(-1).to(y.dtype))


def train(c, model, steps=5, lr=0.05):
    ids = torch.randint(0, 16, (96,), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(c(ids[:-1]).float(), ids[1:])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("recipe", RECIPES)
def test_grouped_moe_block_trains_in_every_recipe(recipe, tmp_path):
    torch.manual_seed(0)
    model = MoEBlock().bfloat16()
    c = torch.compile(model, backend="autoprec", options={"recipe": recipe})
    losses = train(c, model)
    assert all(map(torch.isfinite, torch.tensor(losses))) and losses[-1] < losses[0]
    plan = autoprec.plan(c)
    rows = [d for d in plan.decisions if d.module == "experts"]
    assert sorted(str(d.role) for d in rows) == ["dgrad", "dgrad", "fprop", "fprop", "wgrad", "wgrad"]
    assert all(d.groups == 4 and d.shape[0 if str(d.role) != "wgrad" else 2] == "95" for d in rows)
    assert "not planned" not in plan.flop_share() and not any("experts" in p for p, _ in plan.unplanned_params)
    text = str(plan)
    assert "4 experts: 95x64x32" in text and "experts experts: 4 experts" in text
    if recipe in ("bf16", "mxfp8", "nvfp4"):
        assert {d.fmt for d in rows} == {recipe}
    if recipe == "nvfp4_nvidia":  # 16x16 tiles on each expert's weight, SR on gradients, RHT on wgrad
        assert all(d.tile2d for d in rows if str(d.role) != "wgrad")
        assert all(d.rht and d.rounding == "sr" for d in rows if str(d.role) == "wgrad")
    if recipe == "auto":  # per-expert token counts and errors from calibration, costed per expert
        assert all(d.group_tokens is not None and sum(d.group_tokens) == 95 for d in rows)
        assert all(len(d.group_err) == 4 for d in rows) and "err per expert: fprop" in text
        assert "tokens per expert in calibration: " in text
        plan.save(tmp_path / "plan.json")
        assert autoprec.Plan.load(tmp_path / "plan.json").decisions == plan.decisions  # schema 3 round trip


def test_expert_gemms_are_costed_per_expert_at_their_token_counts():
    """At a scale where experts are compute-bound, all tokens on one expert costs more than an even split:
    the idle experts still read their weights. The solver and the plan cost with calibration's counts."""
    torch.manual_seed(0)
    model = MoEBlock().bfloat16()
    c = torch.compile(model, backend="autoprec", options={"recipe": "auto"})
    train(c, model, steps=2)
    state = planners_of(model)[-1]
    spec = next(s for k, s in state.specs.items() if k == ("experts", "fprop", 0))
    big = replace(spec, dims=(1, 65536, 8192, 8192))
    hw = get_hardware("gb300")
    assert big.seconds("nvfp4", hw, (65536.0, 0.0, 0.0, 0.0)) > big.seconds("nvfp4", hw)
    d = next(d for d in autoprec.plan(c).decisions if d.key == spec.key)
    assert d.seconds == spec.seconds(d.fmt, hw, state.calibration.tokens_per_group(spec.key))


def test_compiled_expert_gemms_are_bit_exact_with_the_grouped_kernel():
    """Forward output and expert weight gradient of a compiled nvfp4 grouped GEMM equal grouped_mm's."""
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(3, 32, 48).bfloat16())
    x = torch.randn(40, 32).bfloat16()
    offs = torch.tensor([9, 9, 40], dtype=torch.int32)  # an empty expert, groups of 9 and 31 tokens

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = w

        def forward(self, x, offs):
            return F.grouped_mm(x, self.w, offs=offs)

    c = torch.compile(M(), backend="autoprec", options={"recipe": "nvfp4_nvidia"})
    y = c(x, offs)
    g = torch.randn(40, 48, generator=torch.Generator().manual_seed(1)).bfloat16()
    y.backward(g)
    by_role = {str(d.role): d for d in autoprec.plan(c).decisions}
    f, wg = by_role["fprop"], by_role["wgrad"]
    want = grouped_mm(x, w.detach(), offs, "nvfp4", tile2d_b=True, seeds=f.seeds, out_dtype=torch.bfloat16)
    assert torch.equal(y, want)
    want_dw = grouped_mm(x.t(), g, offs, "nvfp4", rounding_b="sr", rht=True, rht_signs=autoprec.kernels.rht_signs(0),
                         seeds=wg.seeds, step=1, out_dtype=torch.bfloat16)  # the model's first call is step 1
    assert torch.equal(w.grad, want_dw) and torch.equal(w.grad[1], torch.zeros(32, 48, dtype=torch.bfloat16))


class Baddbmm(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.w = nn.Embedding(16, 32), nn.Parameter(torch.randn(4, 32, 32) * 0.1)

    def forward(self, idx):
        x = self.emb(idx).view(4, 4, 32)
        return torch.baddbmm(x, x, self.w)


def test_unsupported_matmul_op_is_counted_and_named():
    c = torch.compile(Baddbmm(), backend="autoprec", options={"recipe": "nvfp4"})
    with torch.no_grad():
        c(torch.arange(16))
    plan = autoprec.plan(c)
    assert plan.flop_share()["not planned"] == 1.0
    assert "FLOPs: not planned 100%" in str(plan) and "aten.baddbmm" in str(plan)
    assert ("w", "op not supported: aten.baddbmm") in plan.unplanned_params
    assert ("emb.weight", "not a matmul (e.g. an embedding table)") in plan.unplanned_params


def test_grouped_gemm_on_triton_kernels(monkeypatch):
    """With the Triton kernels (interpreted here), each group's quantization is the reference's bit for bit
    and the product agrees to the accumulation order."""
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    pytest.importorskip("triton")
    x, w = torch.randn(40, 32), torch.randn(3, 32, 16)
    offs = torch.tensor([9, 9, 40], dtype=torch.int32)
    got = grouped_mm(x, w, offs, "nvfp4", rounding_a="sr", seeds=(3, 4), step=2)
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    want = grouped_mm(x, w, offs, "nvfp4", rounding_a="sr", seeds=(3, 4), step=2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class NonzeroMoE(torch.nn.Module):
    """Top-1 routing written as users loop over experts: each expert's tokens found with ``nonzero``."""

    def __init__(self, d: int = 64, experts: int = 4) -> None:
        super().__init__()
        self.router = torch.nn.Linear(d, experts)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            idx = (top == i).nonzero().squeeze(-1)
            out = out.index_add(0, idx, expert(x[idx]))
        return out


def test_data_dependent_token_counts_plan_by_k_and_n():
    """Compiled with ``capture_dynamic_output_shape_ops`` (how users compile such loops), an expert's M is
    data-dependent: its fprop still takes NVFP4 (K and N decide the blocks); its wgrad, whose K is that count, runs
    BF16 and says why; nothing aborts."""
    torch.manual_seed(0)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        model = torch.compile(NonzeroMoE(), backend="autoprec", options={"recipe": "nvfp4"})
        for _ in range(2):
            model(torch.randn(32, 64)).sum().backward()
    rows = {d.key: d for d in autoprec.plan(model).decisions}
    assert rows[("experts.0", "fprop", 0)].fmt == "nvfp4" and rows[("experts.0", "fprop", 0)].shape[0].startswith("u")
    wgrad = rows[("experts.0", "wgrad", 0)]
    assert wgrad.fmt == "bf16" and "is dynamic and not provably a multiple" in wgrad.reason
