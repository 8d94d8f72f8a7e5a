"""Hugging Face transformers models built from tiny configs (no downloads): overrides and plan files by
root-relative module path, dynamic shapes."""
import pytest
import torch

import autoprec

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def steps(c, batches=(2, 2)) -> None:
    for b in batches:
        ids = torch.randint(0, 128, (b, 16), generator=torch.Generator().manual_seed(b))
        c(input_ids=ids, labels=ids).loss.backward()


def test_gpt2_overrides_and_plan_file_by_module_path(tmp_path):
    c = torch.compile(gpt2(), backend="autoprec", options={"recipe": "nvfp4", "overrides": {"lm_head": "bf16"}})
    steps(c)
    plan = autoprec.plan(c)
    head = [d for d in plan.decisions if d.module == "lm_head"]
    assert len(head) == 3 and all(d.fmt == "bf16" for d in head)
    assert ("transformer.h.1.mlp.c_fc", "fprop", 0) in [d.key for d in plan.decisions]
    path = tmp_path / "plan.json"
    plan.save(path)
    torch._dynamo.reset()
    c2 = torch.compile(gpt2(), backend="autoprec", options={"plan": str(path)})
    steps(c2)
    again = autoprec.plan(c2)
    assert [(d.key, d.fmt) for d in again.decisions] == [(d.key, d.fmt) for d in plan.decisions]


def test_gpt2_dynamic_shapes():
    """Every GEMM planned, the head and attention too: their frames read GPT-2's float attributes (dropout p,
    epsilons), which ``dynamic=True`` passes as tensors."""
    c = torch.compile(gpt2(), backend="autoprec", dynamic=True, options={"recipe": "mxfp8"})
    steps(c, batches=(2, 3, 4))
    plan = autoprec.plan(c)
    assert plan.flop_share().get("mxfp8", 0) > 0.5 and len({d.key for d in plan.decisions}) == len(plan.decisions)
    layers = [f"transformer.h.{i}.{m}" for i in (0, 1) for m in ("attn", "attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                                     "mlp.c_proj")]
    assert {d.module for d in plan.decisions} == {"lm_head", *layers}


@pytest.mark.parametrize("model", ["gpt2", "mixtral"])
def test_trainer_with_a_model_compiled_in_place(model):
    """The path examples/hf_trainer.py shows: model.compile(backend="autoprec"), then Trainer; the MoE's
    experts are planned too."""
    pytest.importorskip("accelerate")
    from hf_trainer import train

    losses, plan = train(steps=6, recipe="nvfp4", model_name=model)
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert plan.flop_share().get("nvfp4", 0) > 0.5
    if model == "mixtral":
        assert {d.fmt for d in plan.decisions if d.groups == 4} == {"nvfp4"} and len(plan.experts_lines()) == 2


def test_trainer_backend_option_is_rejected_by_accelerate(tmp_path):
    """Why the example compiles the model itself: Trainer's own backend option cannot name autoprec."""
    pytest.importorskip("accelerate")
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                          torch_compile=True, torch_compile_backend="autoprec")
    with pytest.raises(ValueError, match="not a valid DynamoBackend"):
        transformers.Trainer(model=gpt2(), args=args)


def test_gpt2_blocks_compiled_on_their_own_plan_the_model():
    """Each decoder layer compiled alone (``layer.compile``): one plan, named from the model, overridable
    by those names; the embeddings and head are listed as outside the compiled modules."""
    m = gpt2()
    for layer in m.transformer.h:
        layer.compile(backend="autoprec", options={"recipe": "nvfp4", "overrides": {"transformer.h.0.mlp.*": "bf16"}})
    steps(m)
    plan = autoprec.plan(m)
    fmts = {d.module: d.fmt for d in plan.decisions if ".mlp." in d.module}
    assert fmts == {"transformer.h.0.mlp.c_fc": "bf16", "transformer.h.0.mlp.c_proj": "bf16",
                    "transformer.h.1.mlp.c_fc": "nvfp4", "transformer.h.1.mlp.c_proj": "nvfp4"}
    assert plan.not_compiled == ["transformer.wte", "transformer.wpe", "lm_head"]


def test_llama_layers_planned_alike_share_their_compiles(inner_compiles):
    """Each Llama decoder layer compiled alone: its KV cache's layer guard gives every layer a dynamo graph of its
    own, yet layers planned alike (nvfp4_nvidia: SR gradients; the last of three in BF16) rewrite to the same
    code and run one compiled forward and backward per kind (inner_compiles.py), each layer in its plan."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    m = transformers.LlamaForCausalLM(cfg)
    for layer in m.model.layers:
        layer.compile(backend="autoprec", options={"recipe": "nvfp4_nvidia"})
    steps(m, batches=(2,))
    plan = autoprec.plan(m)
    assert {d.module.split(".")[2] for d in plan.decisions} == {"0", "1", "2"}
    assert {d.fmt for d in plan.decisions if d.module.startswith("model.layers.2.")} == {"bf16"}
    assert len(inner_compiles) == 2 * 2
