"""Regional compilation (each block compiled on its own, as torchtitan does): one plan for the whole model,
with the model's names, its overrides, one calibration, and the numerics of compiling the model whole."""
import pytest
import torch

import autoprec
from autoprec.inner_compiles import _COMPILED
from autoprec.planner.model_planner import planners_of

from gpt_model import TinyGPT, tokens
from helpers import bits_equal

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def gpt(**kw) -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(vocab=64, d=64, layers=3, heads=2, ctx=16, **kw)


def compile_blocks(blocks: torch.nn.ModuleList | torch.nn.Sequential, how: str, options: dict) -> None:
    """``wrap``: torchtitan's ``register_module(i, torch.compile(block))``; ``in_place``: ``block.compile()``."""
    for i, block in enumerate(blocks):
        if how == "wrap":
            blocks.register_module(str(i), torch.compile(block, backend="autoprec", options=options))
        else:
            block.compile(backend="autoprec", options=options)


@pytest.mark.parametrize("how", ["wrap", "in_place"])
def test_compiled_blocks_share_one_plan_named_from_the_model(how):
    m = gpt()
    compile_blocks(m.blocks, how, {"recipe": "nvfp4", "overrides": {"blocks.0.*": "bf16"}})
    m(*tokens(batch=2, ctx=16, vocab=64)).backward()
    plan = autoprec.plan(m)
    assert len(planners_of(m)) == 1
    keys = [d.key for d in plan.decisions]
    assert len(keys) == len(set(keys))
    assert {d.module for d in plan.decisions if d.module.endswith(".attn.qkv")} == {f"blocks.{i}.attn.qkv"
                                                                                   for i in range(3)}
    assert all(d.fmt == ("bf16" if d.module.startswith("blocks.0.") else "nvfp4") for d in plan.decisions)
    assert set(plan.not_compiled) == {"wte", "wpe", "lm_head"}  # outside the compiled blocks, and said so
    assert "outside the compiled modules" in str(plan)
    block = autoprec.plan(m.blocks[1])  # asked of a block: the model's plan, and why
    assert [d.key for d in block.decisions] == keys and "part of a TinyGPT compiled module by module" in str(block)


def test_an_override_naming_no_module_of_the_model_fails_by_name():
    m = gpt()
    compile_blocks(m.blocks, "in_place", {"recipe": "nvfp4", "overrides": {"attn.qkv": "bf16"}})
    with pytest.raises(Exception, match="overrides: .attn.qkv. matches no module of this model; closest: blocks"):
        m(*tokens(batch=2, ctx=16, vocab=64)).backward()


def test_compiled_blocks_compute_what_the_model_compiled_whole_computes():
    """Blocks compiled one by one and the same blocks compiled as one model run the same plan, bit for bit
    (round to nearest: SR's call counter counts graph calls, one per block here)."""
    x = torch.randn(2, 16, 64)
    runs = []
    for regional in (False, True):
        torch._dynamo.reset()
        blocks = torch.nn.Sequential(*gpt().blocks)
        if regional:
            compile_blocks(blocks, "wrap", {"recipe": "nvfp4"})
            fn = blocks
        else:
            fn = torch.compile(blocks, backend="autoprec", options={"recipe": "nvfp4"})
        xi = x.clone().requires_grad_()
        out = fn(xi)
        out.square().mean().backward()
        plan = autoprec.plan(blocks)
        runs.append((out, xi.grad, [p.grad for p in blocks.parameters()], [(d.key, d.fmt) for d in plan.decisions]))
    (out0, gx0, gp0, plan0), (out1, gx1, gp1, plan1) = runs
    assert sorted(plan0) == sorted(plan1)
    assert bits_equal(out0, out1) and bits_equal(gx0, gx1)
    assert all(bits_equal(a, b) for a, b in zip(gp0, gp1))


def block_decisions(plan) -> dict[str, tuple]:
    """Each block's decisions, named inside the block (what its compiled graph depends on)."""
    by_block: dict[str, list] = {}
    for d in plan.decisions:
        _, index, rest = d.module.split(".", 2)
        by_block.setdefault(index, []).append((rest, d.role, d.key[2], d.fmt, d.rounding, d.rht, d.tile2d))
    return {index: tuple(sorted(rows)) for index, rows in by_block.items()}


@pytest.mark.parametrize("experts", [0, 4])
def test_blocks_with_the_same_decisions_compile_once(inner_compiles, monkeypatch, experts):
    """The inner compiler (inductor's, in practice) and the min-cut partition run once per distinct block, not once
    per block: blocks planned alike share one compiled forward and backward, and each draws the SR bits of its own
    plan seeds, bit for bit those of graphs holding the seeds themselves (each block's own compile, as before
    sharing); with MoE MLPs, each expert's too."""
    from autoprec import backend

    partitions, partition = [], backend.min_cut_rematerialization_partition
    monkeypatch.setattr(backend, "min_cut_rematerialization_partition",
                        lambda *a, **kw: partitions.append(1) or partition(*a, **kw))
    runs = []
    for shared in (True, False):
        torch._dynamo.reset()
        inner_compiles.clear()
        partitions.clear()
        _COMPILED.clear()  # the second run compiles its own graphs, not the first's
        if not shared:  # no offset: each block's graph holds its plan's seeds and the step input is the counter
            monkeypatch.setattr(backend, "path_key", lambda path: 0)
        torch.manual_seed(0)
        m = TinyGPT(vocab=64, d=64, layers=4, heads=2, ctx=16, experts=experts)
        compile_blocks(m.blocks, "wrap", {"recipe": "nvfp4_nvidia"})  # SR gradients; its last block in BF16
        loss = m(*tokens(batch=2, ctx=16, vocab=64))
        loss.backward()
        grads = [p.grad for p in m.parameters() if p.grad is not None]
        runs.append((loss, grads, (len(inner_compiles), len(partitions)), block_decisions(autoprec.plan(m))))
    (loss0, grads0, compiles0, kinds), (loss1, grads1, compiles1, _) = runs
    assert len(kinds) == 4 and len(set(kinds.values())) == 2
    assert compiles0 == (2 * 2, 2)  # a forward and a backward, from one partition, per kind of block
    assert compiles1 == (2 + 4, 4)  # the forwards (round to nearest: no seeds) per kind, the SR backwards per block
    assert len(grads0) == len(grads1) and bits_equal(loss0, loss1)
    assert all(bits_equal(a, b) for a, b in zip(grads0, grads1))


@pytest.mark.slow
def test_blocks_share_inductors_compile(monkeypatch):
    """With inner inductor (what the sharing saves: its compile is most of a block's), blocks planned alike cost
    one forward and one backward compile, and compute what compiles of their own compute."""
    import torch._inductor.compile_fx as compile_fx

    from autoprec import backend

    compiles, inner = [], compile_fx.compile_fx_inner
    monkeypatch.setattr(compile_fx, "compile_fx_inner", lambda *a, **kw: compiles.append(1) or inner(*a, **kw))
    runs = []
    for shared in (True, False):
        torch._dynamo.reset()
        compiles.clear()
        _COMPILED.clear()
        if not shared:
            monkeypatch.setattr(backend, "path_key", lambda path: 0)
        m = gpt()
        compile_blocks(m.blocks, "wrap", {"recipe": "nvfp4_nvidia", "inner": "inductor"})  # block 2 in BF16
        loss = m(*tokens(batch=2, ctx=16, vocab=64))
        loss.backward()
        runs.append((loss, [p.grad for p in m.parameters()], len(compiles)))
    (loss0, grads0, compiles0), (loss1, grads1, compiles1) = runs
    assert compiles0 == 2 * 2 and compiles1 == 2 + 3  # per kind of block; unshared, the SR backwards per block
    assert bits_equal(loss0, loss1) and all(bits_equal(a, b) for a, b in zip(grads0, grads1))


def test_auto_calibrates_every_compiled_block_into_one_plan_and_resumes_it():
    m = gpt()
    compile_blocks(m.blocks, "wrap", {"recipe": "auto"})
    for _ in range(2):
        m(*tokens(batch=4, ctx=16, vocab=64)).backward()
    plan = autoprec.plan(m)
    assert {d.module.split(".")[1] for d in plan.decisions} == {"0", "1", "2"}
    assert all(d.err is not None and d.reason.startswith("auto (") for d in plan.decisions)
    state = autoprec.state_dict(m)
    torch._dynamo.reset()
    m2 = gpt()
    autoprec.load_state_dict(m2, state)  # before the first call, as a resumed run does
    compile_blocks(m2.blocks, "wrap", {"recipe": "auto"})
    m2(*tokens(batch=4, ctx=16, vocab=64)).backward()
    resumed = autoprec.plan(m2)
    assert [(d.key, d.fmt) for d in resumed.decisions] == [(d.key, d.fmt) for d in plan.decisions]
    assert all(d.reason.startswith("plan file") for d in resumed.decisions)


class Wrapper(torch.nn.Module):
    """Holds the model and nothing else, as DDP does (``module``)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args):
        return self.module(*args)


def test_a_wrapped_model_is_planned_at_the_wrapper_and_resumes_through_either():
    """Blocks compiled one by one inside a DDP-like wrapper: the plan is the wrapper's (names start with
    ``module.``, as when DDP is compiled whole); the inner model finds it too, and a state restored through the
    inner model reaches the wrapper's plan."""
    wrapped = Wrapper(gpt())
    compile_blocks(wrapped.module.blocks, "in_place", {"recipe": "auto"})
    for _ in range(2):
        wrapped(*tokens(batch=4, ctx=16, vocab=64)).backward()
    plan = autoprec.plan(wrapped)
    assert ("module.blocks.2.mlp.fc2", "wgrad", 0) in [d.key for d in plan.decisions]
    assert [d.key for d in autoprec.plan(wrapped.module).decisions] == [d.key for d in plan.decisions]
    state = autoprec.state_dict(wrapped.module)
    torch._dynamo.reset()
    again = Wrapper(gpt())
    autoprec.load_state_dict(again.module, state)
    compile_blocks(again.module.blocks, "in_place", {"recipe": "auto"})
    again(*tokens(batch=4, ctx=16, vocab=64)).backward()
    resumed = autoprec.plan(again)
    assert [(d.key, d.fmt) for d in resumed.decisions] == [(d.key, d.fmt) for d in plan.decisions]
    assert all(d.reason.startswith("plan file") for d in resumed.decisions)


def test_a_reused_compile_reports_the_output_strides_of_its_compile():
    """A graph compiled once runs again without compiling (for another block, or another dynamo graph of the same
    code), and reports the output strides its compile reported (inductor's layout of the forward's outputs, which
    AOTAutograd lays the backward's saved inputs out by); a graph of other code, constants or inputs compiles."""
    from torch._guards import TracingContext, tracing

    from autoprec.inner_compiles import compile_once

    calls = []

    def compiler(g, example_inputs):
        calls.append(g.code)
        TracingContext.get().output_strides.append((1, 8))  # as inductor reports a forward's output
        return lambda args: g(*args)

    class Scale(torch.nn.Module):
        def __init__(self, by: float) -> None:
            super().__init__()
            self.by = torch.tensor(by)  # a plain tensor attribute: a constant of the traced graph

        def forward(self, a):
            return a * self.by

    keep, x = [], torch.randn(8, 8)
    cases = [(Scale(2.0), x), (Scale(2.0), x), (Scale(3.0), x), (Scale(2.0), x.t()), (Scale(2.0), x)]
    for module, a in cases:
        with tracing(TracingContext(None)), TracingContext.report_output_strides() as strides:
            keep.append(compile_once(compiler, ("test",))(torch.fx.symbolic_trace(module), [a]))
        assert strides == [(1, 8)]
    assert len(calls) == 3  # 2.0 on x, 3.0, 2.0 on x.t()
    assert keep[1] is keep[0] is keep[4] and len({id(f) for f in keep}) == 3
    with tracing(TracingContext(None)), TracingContext.report_output_strides():
        assert compile_once(compiler, ("other settings",))(torch.fx.symbolic_trace(Scale(2.0)), [x]) is not keep[0]


class IndexedMLP(torch.nn.Module):
    """An MLP whose forward reads its index (as a layer reads its KV cache's): dynamo guards on it, so every
    instance gets a dynamo graph of its own, of the same code."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index
        self.fc1, self.fc2 = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x))) if self.index >= 0 else x


@pytest.mark.parametrize("dynamic", [False, True])
def test_graphs_with_symbolic_sizes_share_compiles_only_within_their_shape_environment(inner_compiles, dynamic):
    """Two dynamo graphs of the same code share their compiles when their sizes are static; with symbolic sizes
    each was compiled under its own shape environment's facts, so each compiles."""
    torch.manual_seed(0)
    mlps = torch.nn.ModuleList(IndexedMLP(i) for i in range(2))
    for mlp in mlps:
        mlp.compile(backend="autoprec", options={"recipe": "nvfp4"}, dynamic=dynamic)
        mlp(torch.randn(32, 64, requires_grad=True)).sum().backward()
    assert len(inner_compiles) == 2 * (2 if dynamic else 1)
