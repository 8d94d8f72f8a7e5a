"""Activation checkpointing (torch's checkpoint_wrapper around each block, as torchtitan and FSDP users do):
the plan names modules as the model does (no ``_checkpoint_wrapped_module``), overrides match those names,
and the recomputed forward gives the gradients the model gets without checkpointing, bit for bit."""
import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

import autoprec

from gpt_model import TinyGPT, tokens
from helpers import bits_equal

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

OPTIONS = {"recipe": "nvfp4", "overrides": {"blocks.1.mlp.*": "mxfp8"}}


def gpt(checkpointed: bool) -> TinyGPT:
    torch.manual_seed(0)
    m = TinyGPT(vocab=64, d=64, layers=2, heads=2, ctx=16)
    if checkpointed:
        for i, block in enumerate(m.blocks):
            m.blocks.register_module(str(i), checkpoint_wrapper(block))
    return m


def train(m: torch.nn.Module, fn, steps: int = 2) -> tuple[torch.Tensor, list[torch.Tensor], list, int]:
    """(last loss, gradients, plan rows, bytes the training graphs save for the backward)."""
    for step in range(steps):
        loss = fn(*tokens(batch=4, ctx=16, vocab=64, seed=step))
        loss.backward()
    plan = autoprec.plan(m)
    saved = sum(plan.saved_bytes.values())
    return loss.detach(), [p.grad for p in m.parameters()], [(d.key, d.fmt, d.err) for d in plan.decisions], saved


@pytest.mark.parametrize("options", [OPTIONS, {"recipe": "auto"}], ids=["nvfp4_overrides", "auto"])
def test_checkpointed_blocks_keep_names_overrides_and_numerics(options):
    """The same plan (auto: the same measurements), loss and gradients (auto: SR included) as without."""
    plain = gpt(False)
    loss0, grads0, plan0, saved0 = train(plain, torch.compile(plain, backend="autoprec", options=options), 3)
    torch._dynamo.reset()
    ac = gpt(True)
    loss1, grads1, plan1, saved1 = train(ac, torch.compile(ac, backend="autoprec", options=options), 3)
    assert saved1 < saved0 / 2  # the blocks' activations are recomputed, not kept
    assert plan1 == plan0 and ("blocks.1.mlp.fc1", "fprop", 0) in [k for k, _, _ in plan1]
    if "overrides" in options:
        assert {f for k, f, _ in plan1 if k[0].startswith("blocks.1.mlp.")} == {"mxfp8"}
    assert bits_equal(loss0, loss1) and all(bits_equal(a, b) for a, b in zip(grads0, grads1))


def test_checkpointed_blocks_compiled_on_their_own():
    """torchtitan's order: checkpoint-wrap each block, then compile each wrapped block; one plan of the model."""
    m = gpt(True)
    for i, block in enumerate(m.blocks):
        m.blocks.register_module(str(i), torch.compile(block, backend="autoprec", options=OPTIONS))
    _, grads, plan, _ = train(m, m)
    modules = {k[0] for k, _, _ in plan}
    assert {"blocks.0.attn.qkv", "blocks.1.mlp.fc2"} <= modules and not any("wrapped" in n for n in modules)
    assert all(torch.isfinite(g).all() for g in grads if g is not None)
