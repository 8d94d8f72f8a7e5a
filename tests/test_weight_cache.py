"""An RL sampler's weights are prepared once per weight version, and never served stale: after every way an RL loop
writes its weights, the next call equals a call with every weight prepared anew (``autoprec.refresh_weights``)."""
import copy

import pytest
import torch

import autoprec
from autoprec.kernels import weight_cache

from gpt_model import TinyGPT, tokens

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def sampler(recipe: str) -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyGPT(vocab=64, d=64, layers=2, heads=2, ctx=16)
    idx, _ = tokens(batch=4, ctx=16, vocab=64)
    compiled = torch.compile(model, backend="autoprec", options={"phase": "rl_sampler", "recipe": recipe})
    with torch.no_grad():
        compiled(idx)  # calibrates (static activation scales), then the plan is fixed
    return model, compiled, idx


def fresh(compiled: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    weight_cache.refresh()
    with torch.no_grad():
        return compiled(idx)


def write_optimizer(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()


def write_load_state_dict(model):
    model.load_state_dict({k: v + 0.05 for k, v in model.state_dict().items()})


def write_copy(model):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p * 1.1)


def write_data_assignment(model):
    for p in model.parameters():
        p.data = p.data * 0.9


WRITES = {"optimizer step": write_optimizer, "load_state_dict": write_load_state_dict, "copy_": write_copy,
          ".data assignment": write_data_assignment}


@pytest.mark.parametrize("recipe", ["nvfp4", "bf16"])
@pytest.mark.parametrize("write", list(WRITES))
def test_a_changed_weight_is_never_served_stale(recipe, write):
    model, compiled, idx = sampler(recipe)
    with torch.no_grad():
        before = compiled(idx)
        assert torch.equal(compiled(idx), before) and weight_cache.cached_count() > 0
    WRITES[write](model)
    with torch.no_grad():
        after = compiled(idx)
    assert not torch.equal(after, before)
    assert torch.equal(after, fresh(compiled, idx))


def test_cached_weights_give_the_uncached_product_bit_for_bit():
    """The sampler's graphs (weights cached) and a trainer's training graph (weights quantized in the graph) agree,
    and a second call reuses every prepared weight (none prepared again)."""
    model, compiled, idx = sampler("nvfp4")
    trainer = torch.compile(copy.deepcopy(model), backend="autoprec",
                            options={"phase": "rl_trainer", "match": autoprec.plan(compiled), "recipe": "nvfp4"})
    with torch.no_grad():
        want = compiled(idx)
        entries = dict(weight_cache._CACHE)
        compiled(idx)
    assert entries and weight_cache._CACHE == entries  # the same prepared weights, none made again
    assert torch.equal(trainer(idx).detach(), want)


def test_writes_through_data_need_refresh_weights():
    """``param.data.copy_`` bumps no version counter the graphs can see: the documented case for
    ``autoprec.refresh_weights``."""
    model, compiled, idx = sampler("nvfp4")
    with torch.no_grad():
        before = compiled(idx)
        for m in model.blocks.modules():  # the blocks' GEMM weights (the head's is tied to the embedding)
            if isinstance(m, torch.nn.Linear):
                m.weight.data.copy_(m.weight.data * 1.5)
        assert torch.equal(compiled(idx), before)  # stale, as documented
        autoprec.refresh_weights()
        assert not torch.equal(compiled(idx), before)
