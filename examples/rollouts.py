"""RL rollouts with Hugging Face models from tiny configs: a sampler that decodes with a KV cache, a trainer that
scores the finished sequences, and how far the two disagree on the sampled tokens.

Shared by ``benchmarks/rl_mismatch.py``, ``examples/rl_loop.py`` and the tests (``tests/test_rl_rollouts.py``).
The models are built from configs in code, so nothing is downloaded; the head is scaled so the policy is peaky,
as a trained one is.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

MODELS = ("llama", "qwen3_moe", "gpt2")
PAD, BOS, EOS = 0, 1, 2


def tiny_model(kind: str, vocab: int = 256, hidden: int = 64, layers: int = 2, seed: int = 0,
               attention: str = "sdpa") -> torch.nn.Module:
    """A causal LM of ``kind`` (``MODELS``) from a tiny config, dropout off (as RL trainers run), in eval mode;
    ``attention``: transformers' attention implementation (``eager`` runs attention as two planned products)."""
    import transformers

    torch.manual_seed(seed)
    ids = dict(pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
    if kind == "llama":
        cfg = transformers.LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=2 * hidden,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab,
                                       max_position_embeddings=128, **ids)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=2 * hidden,
                                          moe_intermediate_size=hidden // 2, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=16, vocab_size=vocab, num_experts=4,
                                          num_experts_per_tok=2, max_position_embeddings=128, **ids)
        model = transformers.Qwen3MoeForCausalLM(cfg)
    elif kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=layers, n_embd=hidden, n_head=2, vocab_size=vocab, n_positions=128,
                                      attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, **ids)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        raise ValueError(f"unknown model kind {kind!r}; choose from {', '.join(MODELS)}")
    model.set_attn_implementation(attention)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)  # a peaky policy (tied to the embeddings in GPT-2: both)
    return model.eval()


def prompts(batch: int, max_len: int, vocab: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts of random lengths 3..max_len: (input_ids, attention_mask)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(3, max_len + 1, (batch,), generator=g)
    ids = torch.full((batch, max_len), PAD, dtype=torch.long)
    mask = torch.zeros(batch, max_len, dtype=torch.long)
    for i, n in enumerate(lens.tolist()):
        ids[i, max_len - n:] = torch.randint(3, vocab, (n,), generator=g)
        mask[i, max_len - n:] = 1
    return ids, mask


@dataclass
class Rollouts:
    """Finished sequences (prompt + completion), their attention mask, the prompt length, and the sampler's
    log-probabilities of the tokens it sampled (one row per sequence, one column per new token)."""

    sequences: torch.Tensor
    mask: torch.Tensor
    prompt_len: int
    logprobs: torch.Tensor

    @property
    def completions(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_len:]


def sample(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int, seed: int = 0) -> Rollouts:
    """``generate`` with sampling and a KV cache; the sampler's log-probs from the logits it sampled from."""
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, output_logits=True, return_dict_in_generate=True,
                             pad_token_id=PAD)
    new = out.sequences[:, ids.shape[1]:]
    logits = torch.stack(out.logits, 1).float()
    logprobs = torch.log_softmax(logits, -1).gather(-1, new[..., None])[..., 0]
    return Rollouts(out.sequences, torch.cat([mask, torch.ones_like(new)], 1), ids.shape[1], logprobs)


def score(model: torch.nn.Module, r: Rollouts, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The trainer's log-probs of the sampled tokens of rollouts ``rows`` (all by default), in one forward over
    the finished sequences (the model's mode as it is: a trainer scores in training mode)."""
    rows = torch.arange(r.sequences.shape[0]) if rows is None else rows
    seq, mask = r.sequences[rows], r.mask[rows]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=seq, attention_mask=mask, position_ids=positions).logits.float()
    logprobs = torch.log_softmax(logits[:, r.prompt_len - 1:-1], -1)
    return logprobs.gather(-1, r.completions[rows][..., None])[..., 0]


def packings(model: torch.nn.Module, r: Rollouts, micro: int = 2) -> dict[str, torch.Tensor]:
    """The trainer's log-probs scored three ways: the whole batch, micro-batches of ``micro`` and the rows reversed
    (each put back in rollout order)."""
    n = r.sequences.shape[0]
    order = torch.arange(n - 1, -1, -1)
    return {"full batch": score(model, r),
            f"micro-batches of {micro}": torch.cat([score(model, r, torch.arange(i, min(i + micro, n)))
                                                   for i in range(0, n, micro)]),
            "reordered rows": score(model, r, order)[order.argsort()]}


@dataclass
class Mismatch:
    """How far a trainer's log-probs of the sampled tokens are from the sampler's."""

    max_abs_dlogp: float
    mean_abs_dp: float
    identical: float  # the fraction of sampled tokens whose log-prob is bit-identical

    @classmethod
    def of(cls, trainer: torch.Tensor, sampler: torch.Tensor) -> "Mismatch":
        trainer, sampler = trainer.detach().float(), sampler.detach().float()
        return cls(float((trainer - sampler).abs().max()), float((trainer.exp() - sampler.exp()).abs().mean()),
                   float((trainer == sampler).float().mean()))


def compile_sampler(policy: torch.nn.Module, recipe: str, **options) -> torch.nn.Module:
    """A copy of ``policy`` whose forward is compiled in phase ``rl_sampler`` with ``recipe`` and ``options``
    (``generate`` calls it for the prompts, then once per new token)."""
    sampler = copy.deepcopy(policy)
    sampler.forward = torch.compile(sampler.forward, backend="autoprec",
                                    options={"phase": "rl_sampler", "recipe": recipe, **options})
    return sampler


def compile_trainer(policy: torch.nn.Module, sampler: torch.nn.Module | None, **options) -> torch.nn.Module:
    """A copy of ``policy`` in training mode whose forward is compiled in phase ``rl_trainer`` matched to the plan
    ``sampler`` has fixed (with ``options``); with no sampler, a BF16 trainer (the unmatched contrast)."""
    import autoprec

    trainer = copy.deepcopy(policy).train()
    options = ({"phase": "rl_trainer", "match": autoprec.plan(sampler), **options} if sampler is not None
               else {"recipe": "bf16"})
    trainer.forward = torch.compile(trainer.forward, backend="autoprec", options=options)
    return trainer
