"""RL on real rollouts: a sampler compiled in phase ``rl_sampler`` decodes with a KV cache from left-padded prompts
of different lengths; a trainer compiled in ``rl_trainer`` with the sampler's plan scores the finished sequences in
training mode, in one batch, in micro-batches and with its rows reordered. Every sampled token's log-prob is
bit-identical to the sampler's, in every recipe and model (MoE routing included)."""
import itertools

import pytest
import torch

import autoprec

pytest.importorskip("transformers")
from rollouts import MODELS, compile_sampler, compile_trainer, packings, prompts, sample, tiny_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

RECIPES = ("bf16", "mxfp8", "nvfp4", "nvfp4_nvidia", "auto")
FAST = [("llama", "nvfp4"), ("llama", "auto"), ("qwen3_moe", "nvfp4_nvidia"), ("gpt2", "nvfp4")]
# attention is left to torch's fused SDPA, whose CPU kernel computes one decoded query's row otherwise than the same
# row among all queries of a full forward (last bits); BF16 products after it keep those bits where the quantized
# formats' coarser grids mostly absorb them: outside the guarantee (docs/rl.md)
SDPA_BITS = pytest.mark.xfail(reason="fused SDPA's CPU kernel is not decode-invariant to the last bit", strict=False)
CASES = [pytest.param(*c, marks=([] if c in FAST else [pytest.mark.slow]) + ([SDPA_BITS] if c == ("qwen3_moe", "bf16")
                                                                             else []))
         for c in itertools.product(MODELS, RECIPES)]


@pytest.mark.parametrize("kind,recipe", CASES)
def test_trainer_scores_every_sampled_token_as_the_sampler_did(kind, recipe):
    policy = tiny_model(kind)
    sampler = compile_sampler(policy, recipe)
    ids, mask = prompts(batch=4, max_len=6, vocab=256)
    rollouts = sample(sampler, ids, mask, new_tokens=8)
    trainer = compile_trainer(policy, sampler)
    for packing, logprobs in packings(trainer, rollouts).items():
        assert torch.equal(logprobs.detach(), rollouts.logprobs), f"{kind} {recipe}, {packing}"
    plan = autoprec.plan(sampler)
    if recipe in ("nvfp4", "nvfp4_nvidia", "auto"):
        nvfp4 = [d for d in plan.decisions if d.fmt == "nvfp4"]
        assert nvfp4 and all(d.input_amax is not None and d.input_amax[0] > 0 for d in nvfp4)
        assert all("static activation amax" in d.reason for d in nvfp4)


def test_attention_products_run_bf16_and_decoding_matches_the_full_forward():
    """Eager attention (two planned products per layer) in an RL phase: q·kᵀ and p·v run BF16 with the reason (p·v's
    blocks would span tokens; K grows by one token per decode step), and decoding equals the trainer's forward."""
    policy = tiny_model("gpt2", attention="eager")
    sampler = compile_sampler(policy, "nvfp4")
    rollouts = sample(sampler, *prompts(batch=4, max_len=6, vocab=256), new_tokens=8)
    trainer = compile_trainer(policy, sampler)
    assert torch.equal(packings(trainer, rollouts)["full batch"].detach(), rollouts.logprobs)
    attention = [d for d in autoprec.plan(sampler).decisions if d.module.endswith(".attn")]
    assert len(attention) == 4 and all(d.fmt == "bf16" and "two activations" in d.reason for d in attention)
