"""GRPO with TRL under autoprec: one policy both samples (``generate``) and trains, compiled once in phase ``rl``.

    OMP_NUM_THREADS=1 python examples/rl_grpo_trl.py [--steps 3] [--recipe nvfp4]

A tiny Llama from a config and a word-level tokenizer made in code (no downloads); the toy reward counts the
completion tokens in the first half of the vocabulary. ``trl.GRPOTrainer`` runs on CPU without vLLM: it samples
with ``model.generate`` and scores the completions with the model's training forward. In phase ``rl`` both run the
same batch-invariant forward numerics (static NVFP4 activation scales, docs/rl.md), so the log-probs the trainer
computes for the sampled tokens are the sampler's, bit for bit. This example checks that inside TRL's loop: it
keeps the logits of every ``generate`` call, and at every training forward of a completion batch compares TRL's own
per-token log-probs with the sampler's.
"""
from __future__ import annotations

import argparse
import tempfile

import torch
import transformers

import autoprec

VOCAB = 64
PROMPT_LEN = 6


def tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A word-level tokenizer over the words w0..w59 and four special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + [f"w{i}" for i in range(VOCAB - len(specials))])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>",
                                                eos_token="</s>", unk_token="<unk>", padding_side="left")


def policy() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.LlamaForCausalLM(cfg)


def prompts(n: int = 16) -> list[dict]:
    """Prompts of PROMPT_LEN words each (equal lengths: TRL's scoring forward passes no position ids, so a
    left-padded prompt would sit at other positions there than in ``generate``, in any precision)."""
    gen = torch.Generator().manual_seed(0)
    return [{"prompt": " ".join(f"w{int(i)}" for i in torch.randint(0, VOCAB - 4, (PROMPT_LEN,), generator=gen))}
            for _ in range(n)]


def low_words(completions: list[str], **_) -> list[float]:
    """The toy reward: the share of completion words in the first half of the vocabulary."""
    words = [c.split() for c in completions]
    return [sum(int(w[1:]) < (VOCAB - 4) // 2 for w in ws if w[1:].isdigit()) / max(len(ws), 1) for ws in words]


class SamplerRecorder:
    """Wraps ``model.generate`` to keep, per generated sequence, the log-probs of its sampled tokens under the logits
    ``generate`` sampled from."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.by_sequence: dict[tuple[int, ...], torch.Tensor] = {}
        self.generate = model.generate
        model.generate = self

    def __call__(self, *args, **kwargs):
        out = self.generate(*args, **kwargs, output_logits=True, return_dict_in_generate=True)
        new = out.sequences[:, -len(out.logits):]
        logprobs = torch.log_softmax(torch.stack(out.logits, 1).float(), -1).gather(-1, new[..., None])[..., 0]
        for seq, lp in zip(out.sequences.tolist(), logprobs):
            self.by_sequence[tuple(seq)] = lp
        return out.sequences


def head_in_the_compiled_forward(model: torch.nn.Module, temperature: float) -> None:
    """TRL's fused LM head computes the log-probs in chunks outside the compiled graph (dynamo falls back to eager on
    its chunk loop), so its head would run in the model's own precision while ``generate``'s runs as planned. This
    gives TRL the same fields (per-token log-probs and entropies) from the compiled forward's logits instead, so
    the head is one GEMM of the plan in both."""
    from trl.trainer.utils import FusedCausalLMOutput

    forward = model.forward  # TRL's patched forward: without fused_lm_head, the model's own

    def run(*args, fused_lm_head: bool = False, labels=None, **kwargs):
        if not fused_lm_head:
            return forward(*args, **kwargs) if labels is None else forward(*args, labels=labels, **kwargs)
        logprobs = torch.log_softmax(forward(*args, **kwargs).logits[:, :-1].float() / temperature, -1)
        target = labels[:, 1:]
        picked = logprobs.gather(-1, target.clamp(min=0)[..., None])[..., 0].masked_fill(target == -100, 0)
        entropy = -(logprobs.exp() * logprobs).sum(-1)
        return FusedCausalLMOutput(log_probs=picked, entropy=entropy)

    model.forward = run


def compare_trainer_logprobs(trainer, recorder: SamplerRecorder, mismatches: list[float]) -> None:
    """Wraps TRL's per-token log-prob computation: each completion it scores in training mode is compared with the
    sampler's log-probs of the same tokens (max |difference| appended to ``mismatches``)."""
    compute = trainer._get_per_token_logps_and_entropies

    def checked(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        logps, *rest = compute(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        if model.training:
            for seq, lp in zip(input_ids.tolist(), logps.detach().float()):
                want = recorder.by_sequence.get(tuple(seq))
                if want is not None:
                    mismatches.append(float((lp[:want.shape[0]] - want).abs().max()))
        return (logps, *rest)

    trainer._get_per_token_logps_and_entropies = checked


def train(steps: int, recipe: str, compile_model: bool = True) -> tuple[list[float], list[float], autoprec.Plan | None]:
    """GRPO for ``steps`` steps; returns (mean reward per step, the trainer-vs-sampler mismatch of every scored
    completion, the plan)."""
    import datasets
    from trl import GRPOConfig, GRPOTrainer

    model = policy()
    if compile_model:
        model.compile(backend="autoprec", options={"phase": "rl", "recipe": recipe})
    recorder = SamplerRecorder(model)
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
                          max_steps=steps, learning_rate=1e-3, logging_steps=1, report_to=[], save_strategy="no",
                          use_cpu=True, disable_tqdm=True, temperature=1.0, top_k=0, top_p=1.0,
                          generation_kwargs={"min_new_tokens": 8}, gradient_checkpointing=False)
        trainer = GRPOTrainer(model=model, reward_funcs=low_words, args=args,
                              train_dataset=datasets.Dataset.from_list(prompts()), processing_class=tokenizer())
        head_in_the_compiled_forward(model, args.temperature)
        mismatches: list[float] = []
        compare_trainer_logprobs(trainer, recorder, mismatches)
        trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return rewards, mismatches, autoprec.plan(model) if compile_model else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--recipe", default="nvfp4")
    args = parser.parse_args()
    rewards, mismatches, plan = train(args.steps, args.recipe)
    print(plan.summary())
    print(f"mean reward per step: {', '.join(f'{r:.3f}' for r in rewards)}")
    print(f"trainer vs sampler log-probs of the sampled tokens: {len(mismatches)} completions scored, "
          f"max |difference| {max(mismatches, default=float('nan')):.3g}")


if __name__ == "__main__":
    main()
