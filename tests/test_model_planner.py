"""One plan per model: every graph (train, eval, recompiles, prefill / decode, graph-break frames) looks
its GEMMs up in it; SR bits per GEMM and call; the SR counter and the plan travel with checkpoints."""
import copy

import pytest
import torch

import autoprec
import autoprec.kernels.ops as ops
from autoprec.planner.model_planner import PLANNERS

from gpt_model import TinyGPT, tokens
from helpers import bits_equal

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def gpt(**kw) -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(vocab=64, d=64, layers=2, heads=2, ctx=16, **kw)


def keys(plan: autoprec.Plan) -> list:
    return [d.key for d in plan.decisions]


def test_train_eval_train_calibrates_once_and_shares_the_plan():
    m = gpt()
    c = torch.compile(m, backend="autoprec")
    idx, tgt = tokens(batch=4, ctx=16, vocab=64)
    c(idx, tgt).backward()  # calibration
    c(idx, tgt).backward()  # the plan is fixed here, for the whole model
    before = {d.key: (d.fmt, d.rounding, d.rht, d.tile2d) for d in autoprec.plan(c).decisions}
    m.eval()
    with torch.no_grad():
        logits = c(idx)  # first eval call: already quantized, no calibration of its own
        eager = m(idx)
    assert not torch.equal(logits, eager)
    m.train()
    c(idx, tgt).backward()
    plan = autoprec.plan(c)
    assert len(keys(plan)) == len(set(keys(plan)))  # each GEMM once
    assert {d.key: (d.fmt, d.rounding, d.rht, d.tile2d) for d in plan.decisions} == before
    fprop = [d for d in plan.decisions if str(d.role) == "fprop"]
    assert all(len(d.graphs) == 2 and d.graphs[0].startswith("train") and d.graphs[1].startswith("infer")
               for d in fprop)
    assert "graphs" in str(plan).splitlines()[0]


def test_new_batch_size_and_decode_shapes_reuse_the_plan():
    """A recompile for another batch size, and prefill / decode shapes, are new graphs of the same plan."""
    m = gpt()
    c = torch.compile(m, backend="autoprec")
    for batch in (4, 4, 3):
        idx, tgt = tokens(batch=batch, ctx=16, vocab=64)
        c(idx, tgt).backward()
    with torch.no_grad():
        prompt = tokens(batch=1, ctx=16, vocab=64)[0][:, :8]
        for _ in range(3):  # prefill, then "decode" with growing contexts
            nxt = c(prompt)[:, -1].argmax(-1, keepdim=True)
            prompt = torch.cat([prompt, nxt], 1)
    plan = autoprec.plan(c)
    assert len(keys(plan)) == len(set(keys(plan)))
    qkv = next(d for d in plan.decisions if d.key == ("blocks.0.attn.qkv", "fprop", 0))
    assert len(qkv.graphs) >= 3 and not any("after the plan was fixed" in d.reason for d in plan.decisions)
    saved = copy.deepcopy(plan.decisions)
    assert [d.fmt for d in autoprec.plan(c).decisions] == [d.fmt for d in saved]


def test_graph_break_frames_share_one_plan_with_root_relative_names():
    m = gpt(graph_break=True)
    c = torch.compile(m, backend="autoprec", options={"recipe": "nvfp4", "overrides": {"lm_head": "bf16"}})
    c(*tokens(batch=4, ctx=16, vocab=64)).backward()
    plan = autoprec.plan(c)
    mods = {d.module for d in plan.decisions}
    assert {"blocks.0.attn.qkv", "blocks.1.mlp.fc2"} <= mods
    assert len(keys(plan)) == len(set(keys(plan)))


def sr_seeds(monkeypatch) -> list:
    seen = []
    real = ops.dispatch.quantize

    def spy(x, fmt, axis, *, rounding="rne", seed=0, **kw):
        if rounding == "sr":
            seen.append(seed)
        return real(x, fmt, axis, rounding=rounding, seed=seed, **kw)

    monkeypatch.setattr(ops.dispatch, "quantize", spy)
    return seen


def test_gradient_accumulation_draws_fresh_bits_per_micro_batch(monkeypatch):
    c = torch.compile(gpt(), backend="autoprec", options={"recipe": "nvfp4_nvidia"})  # SR on gradients
    seen = sr_seeds(monkeypatch)
    loss = sum(c(*tokens(batch=2, ctx=16, vocab=64, seed=s)) for s in range(4))
    loss.backward()
    assert len(seen) >= 4 * 8 and len(set(seen)) == len(seen)  # every SR quantization draws its own bits


def train(model, steps: int, **options):
    c = torch.compile(model, backend="autoprec", options=options)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for s in range(steps):
        opt.zero_grad()
        c(*tokens(batch=4, ctx=16, vocab=64, seed=s)).backward()
        opt.step()
    return c, opt


def test_resume_is_bit_exact(tmp_path):
    """Two steps, checkpoint (weights, optimizer, autoprec state), a fresh compile, two more steps: the
    same weights as four steps in one go, stochastic rounding included."""
    straight, _ = train(gpt(), 4, recipe="nvfp4_nvidia")
    want = [p.detach().clone() for p in straight.parameters()]
    torch._dynamo.reset()
    PLANNERS.clear()
    first, opt = train(gpt(), 2, recipe="nvfp4_nvidia")
    torch.save({"model": first._orig_mod.state_dict(), "opt": opt.state_dict(), "autoprec": autoprec.state_dict(first)},
               tmp_path / "ckpt.pt")
    torch._dynamo.reset()
    ckpt = torch.load(tmp_path / "ckpt.pt")
    model = gpt()
    model.load_state_dict(ckpt["model"])
    autoprec.load_state_dict(model, ckpt["autoprec"])
    c = torch.compile(model, backend="autoprec", options={"recipe": "nvfp4_nvidia"})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt.load_state_dict(ckpt["opt"])
    for s in (2, 3):
        opt.zero_grad()
        c(*tokens(batch=4, ctx=16, vocab=64, seed=s)).backward()
        opt.step()
    assert all(bits_equal(p.detach(), w) for p, w in zip(c.parameters(), want))


def test_resumed_auto_run_does_not_recalibrate(tmp_path):
    c, _ = train(gpt(), 2)
    state = autoprec.state_dict(c)
    plan = autoprec.plan(c)
    torch._dynamo.reset()
    model = gpt()
    autoprec.load_state_dict(model, state)
    c2 = torch.compile(model, backend="autoprec")
    c2(*tokens(batch=4, ctx=16, vocab=64)).backward()
    resumed = autoprec.plan(c2)
    assert [(d.key, d.fmt) for d in resumed.decisions] == [(d.key, d.fmt) for d in plan.decisions]
    assert all(d.reason.startswith("plan file") for d in resumed.decisions)
    with pytest.raises(ValueError, match="expected the dict autoprec.state_dict returned"):
        autoprec.load_state_dict(model, {"step": 3})


def test_seed_sets_the_rht_signs(monkeypatch):
    signs = []
    real = ops.dispatch.quantize

    def spy(*a, rht_signs=None, **kw):
        if rht_signs is not None:
            signs.append(rht_signs)
        return real(*a, rht_signs=rht_signs, **kw)

    monkeypatch.setattr(ops.dispatch, "quantize", spy)
    for seed in (0, 5):
        c = torch.compile(gpt(), backend="autoprec", options={"recipe": "nvfp4_nvidia", "seed": seed})
        c(*tokens(batch=4, ctx=16, vocab=64)).backward()
        assert signs and all(torch.equal(s, autoprec.kernels.rht_signs(seed)) for s in signs)
        signs.clear()
        torch._dynamo.reset()
    assert not torch.equal(autoprec.kernels.rht_signs(0), autoprec.kernels.rht_signs(5))


@pytest.mark.parametrize("how", ["dynamic", "mode"])
def test_dynamic_and_mode(how):
    kw = {"dynamic": True} if how == "dynamic" else {"mode": "max-autotune-no-cudagraphs"}
    c = torch.compile(gpt(), backend="autoprec", **kw)
    for batch in (4, 3, 2):
        c(*tokens(batch=batch, ctx=16, vocab=64)).backward()
    plan = autoprec.plan(c)
    assert "nvfp4" in plan.flop_share()
    if how == "mode":
        assert any("mode='max-autotune-no-cudagraphs'" in n for n in plan.notes)


class ScaledLinear(torch.nn.Module):
    """A GEMM whose output is scaled by a Python float attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.scale = torch.nn.Linear(64, 64), 0.5

    def forward(self, x):
        return self.fc(x) * self.scale


def test_dynamic_shapes_plan_a_model_that_reads_a_float_attribute():
    """Under ``dynamic=True`` dynamo passes a float attribute as a 0-d tensor the graph reads with ``.item()``;
    the backend plans the graph (it used to fail the frame, which dynamo then ran eager and unplanned). (The
    wgrad's K, the batch, is dynamic: BF16, as the plan says.)"""
    torch.manual_seed(0)
    c = torch.compile(ScaledLinear(), backend="autoprec", dynamic=True, options={"recipe": "mxfp8"})
    for batch in (2, 3):
        c(torch.randn(batch, 64)).sum().backward()
    decisions = autoprec.plan(c).decisions
    assert {(d.module, d.role.value, d.fmt) for d in decisions} == {("fc", "fprop", "mxfp8"), ("fc", "wgrad", "bf16")}
    wgrad = next(d for d in decisions if d.role.value == "wgrad")
    assert "is dynamic and not provably a multiple of the mxfp8 block 32" in wgrad.reason


class WithEvalHead(torch.nn.Module):
    """A model whose eval path runs a GEMM that training never does."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.probe = torch.nn.Linear(32, 32), torch.nn.Linear(32, 16)

    def forward(self, x):
        y = self.body(x)
        return y if self.training else self.probe(y)


def test_gemm_first_met_after_the_plan_is_fixed_is_decided_once_and_says_so():
    m = WithEvalHead()
    c = torch.compile(m, backend="autoprec")
    x = torch.randn(16, 32)
    for _ in range(2):
        c(x).sum().backward()
    m.eval()
    with torch.no_grad():
        for _ in range(2):
            c(x)
    rows = {d.key: d for d in autoprec.plan(c).decisions}
    probe = rows["probe", "fprop", 0]
    assert "decided after the plan was fixed (first met in infer" in probe.reason and probe.fmt == "bf16"
    assert "no calibration data" in probe.reason
    assert not any("after the plan" in d.reason for k, d in rows.items() if k[0] == "body")
    assert len(rows) == len(autoprec.plan(c).decisions)


def test_compiled_forward_method_finds_its_model():
    """``model.forward = torch.compile(model.forward)``: the module was never compiled itself; its plan is
    still found by the model, with root-relative names."""
    m = gpt()
    m.forward = torch.compile(m.forward, backend="autoprec", options={"recipe": "nvfp4"})
    m(*tokens(batch=2, ctx=16, vocab=64)).backward()
    plan = autoprec.plan(m)
    assert ("blocks.1.mlp.fc2", "wgrad", 0) in keys(plan) and plan.not_compiled == []


def test_auto_calibrates_all_graph_break_frames_into_one_plan():
    """Every frame of a model with graph breaks is measured in the same calibration step and planned
    once: every GEMM has its scores and an auto decision, each key once."""
    c = torch.compile(gpt(graph_break=True), backend="autoprec")
    for _ in range(2):
        c(*tokens(batch=4, ctx=16, vocab=64)).backward()
    plan = autoprec.plan(c)
    assert len(keys(plan)) == len(set(keys(plan))) and len({d.module for d in plan.decisions}) >= 10
    assert all(d.err is not None and d.reason.startswith("auto (") for d in plan.decisions)
    budget = [d for d in plan.decisions if "fastest within budget" in d.reason]
    assert len(budget) == len(plan.decisions)
