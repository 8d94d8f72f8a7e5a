"""Train a Hugging Face model with ``transformers.Trainer`` under autoprec (a tiny GPT-2 or Mixtral built from
a config, no downloads): compile the model with ``model.compile(backend="autoprec")`` before handing it to
Trainer.

    OMP_NUM_THREADS=1 python examples/hf_trainer.py [--steps 20] [--recipe auto] [--model mixtral]

Mixtral's experts run as grouped GEMMs; the plan gives each experts module its rows and its tokens per expert.

``TrainingArguments(torch_compile=True, torch_compile_backend="autoprec")`` does not work: Trainer hands the
backend name to accelerate, whose fixed list of dynamo backends rejects it ("'AUTOPREC' is not a valid
DynamoBackend"). Compiling the model in place first needs no Trainer option at all.
"""
from __future__ import annotations

import argparse
import tempfile

import torch
import transformers

import autoprec


def tiny_gpt2() -> transformers.GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def tiny_mixtral() -> transformers.MixtralForCausalLM:
    """4 experts, top-2, transformers' default (grouped_mm) experts implementation."""
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                     num_local_experts=4, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(cfg)


MODELS = {"gpt2": tiny_gpt2, "mixtral": tiny_mixtral}


def toy_data(n: int = 256, ctx: int = 32) -> list[dict]:
    """Token sequences from a 16-token vocabulary: easy to learn, so the loss visibly falls."""
    gen = torch.Generator().manual_seed(0)
    return [{"input_ids": (ids := torch.randint(0, 16, (ctx,), generator=gen)), "labels": ids} for _ in range(n)]


def train(steps: int, recipe: str, model_name: str = "gpt2") -> tuple[list[float], autoprec.Plan]:
    model = MODELS[model_name]()
    model.compile(backend="autoprec", options={"recipe": recipe})  # in place: Trainer keeps this module
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, per_device_train_batch_size=8, max_steps=steps, learning_rate=3e-3, logging_steps=1,
            report_to=[], save_strategy="no", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=toy_data())
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, autoprec.plan(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--recipe", default="auto")
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    args = parser.parse_args()
    losses, plan = train(args.steps, args.recipe, args.model)
    for i, loss in enumerate(losses):
        print(f"step {i:3d}  loss {loss:.4f}")
    print(plan.summary())
    print("\n".join(plan.experts_lines()))


if __name__ == "__main__":
    main()
