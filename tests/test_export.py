"""autoprec.export against the real packages: compressed-tensors parses the config and decompresses the weights,
transformers loads the directory, and compressed-tensors' ModelOpt converter turns the ModelOpt export into the
compressed-tensors one (docs/export.md)."""
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("compressed_tensors")
pytest.importorskip("transformers")
from compressed_tensors.compressors import BaseCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationConfig  # noqa: E402
from export_sampler import modelopt_against_compressed_tensors  # noqa: E402
from rollouts import compile_sampler, prompts, sample, tiny_model  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.utils.quantization_config import CompressedTensorsConfig  # noqa: E402

import autoprec  # noqa: E402
from autoprec.export.checkpoint import checkpoint_names  # noqa: E402
from autoprec.export.formats import inverse_of  # noqa: E402
from autoprec.export.weights import export_plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ROUTERS_BF16 = {"model.layers.*.mlp.gate": {"fprop": "bf16"}}


def planned_sampler(kind: str, recipe: str, **options) -> tuple[torch.nn.Module, torch.nn.Module, tuple]:
    """(policy, its sampler with a fixed plan, the prompts it ran)."""
    policy = tiny_model(kind)
    sampler = compile_sampler(policy, recipe, **options)
    ids, mask = prompts(batch=3, max_len=5, vocab=policy.config.vocab_size)
    sample(sampler, ids, mask, new_tokens=2)
    return policy, sampler, (ids, mask)


def load(path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, quantization_config=CompressedTensorsConfig(dequantize=True))


def decompressed(path) -> dict[str, torch.Tensor]:
    """Each quantized module's weight as compressed-tensors decompresses it, module by module with its own scheme
    (transformers' dequantizing loader takes one scheme for all dense layers, so a mixed-precision directory is
    decompressed here as vLLM reads it: per module)."""
    qc = QuantizationConfig.model_validate(json.loads((path / "config.json").read_text())["quantization_config"])
    tensors = load_file(path / "model.safetensors")
    out = {}
    for scheme in qc.config_groups.values():
        compressor = BaseCompressor.get_value_from_registry(scheme.format)
        for name in scheme.targets:
            local = {k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(name + ".")}
            out[name] = compressor.decompress(local, scheme)["weight"]
    return out


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A Llama sampler under nvfp4 exported both ways."""
    policy, sampler, batch = planned_sampler("llama", "nvfp4")
    out = tmp_path_factory.mktemp("llama")
    ct = autoprec.export(sampler, out / "compressed-tensors")  # the example's layout (modelopt_against_...)
    mo = autoprec.export(sampler, out / "modelopt", format="modelopt")
    return policy, sampler, batch, ct, mo


def test_compressed_tensors_config_and_decompressed_weights(llama):
    """The config is compressed-tensors' own (it parses), every planned Linear is NVFP4 with its static input
    scale, and transformers' decompressed weights are autoprec's dequantized ones rounded to bf16, bit for bit."""
    policy, sampler, _, ct, _ = llama
    config = json.loads((ct / "config.json").read_text())
    qc = QuantizationConfig.model_validate(config["quantization_config"])
    assert qc.format == "nvfp4-pack-quantized" and config["model_type"] == "llama"
    (scheme,) = qc.config_groups.values()
    assert scheme.weights.group_size == 16 and scheme.input_activations.dynamic == "local"
    linears = export_plan(sampler, "plan").weights
    assert len(linears) == 15 and set(scheme.targets) == {q.module for q in linears}
    tensors = load_file(ct / "model.safetensors")
    q = linears[0]
    assert tensors[f"{q.module}.weight_packed"].dtype == torch.uint8 and tensors[f"{q.module}.weight_scale"].dtype == (
        torch.float8_e4m3fn)
    assert torch.equal(tensors[f"{q.module}.input_global_scale"], q.input_global_scale())
    loaded = dict(load(ct).named_modules())
    for q in linears:
        assert torch.equal(q.weight_values().bfloat16(), loaded[q.module].weight.detach().bfloat16()), q.module


def test_loaded_model_computes_what_its_weights_say(llama):
    """transformers' forward on the loaded checkpoint is the policy's forward with autoprec's dequantized weights
    (rounded to bf16, as compressed-tensors decompresses them), activations unquantized; the sampler, which
    quantizes its activations too, differs by what that quantization adds."""
    policy, sampler, (ids, mask), ct, _ = llama
    emulated = copy.deepcopy(policy)
    modules = dict(emulated.named_modules())
    with torch.no_grad():
        for q in export_plan(sampler, "plan").weights:
            modules[q.module].weight.copy_(q.weight_values().bfloat16().float())
        theirs = load(ct)(ids, attention_mask=mask).logits.float()
        torch.testing.assert_close(theirs, emulated(ids, attention_mask=mask).logits, rtol=1e-5, atol=1e-5)
        planned = sampler(ids, attention_mask=mask).logits
    assert 0 < float((planned - theirs).abs().max()) < float(planned.abs().max())


def test_modelopt_export_converts_to_the_compressed_tensors_one(llama):
    """hf_quant_config.json names every quantized layer; compressed-tensors' ModelOpt NVFP4 converter gives the
    compressed-tensors export's tensors, bit for bit, except input scales that no fp32 number inverts to."""
    _, sampler, _, ct, mo = llama
    hf = json.loads((mo / "hf_quant_config.json").read_text())["quantization"]
    assert hf["quant_algo"] == "MIXED_PRECISION" and hf["exclude_modules"] == []
    assert all(v == {"quant_algo": "NVFP4", "group_size": 16} for v in hf["quantized_layers"].values())
    converted, reference, differ = modelopt_against_compressed_tensors(ct.parent)
    assert set(converted) == set(reference)
    assert all(k.endswith(".input_global_scale") for k in differ)
    for k in differ:  # no fp32 value's reciprocal is the encoding scale: one unit in the last place off
        assert torch.nextafter(reference[k], converted[k].reshape(1)) == converted[k].reshape(1)
        assert not torch.equal(1 / inverse_of(reference[k]), reference[k])


def test_mixed_formats_and_a_tied_head(tmp_path):
    """MXFP8 MLPs and NVFP4 elsewhere: a mixed-precision config whose MXFP8 weights decompress exactly. GPT-2's
    head, tied to its embeddings, is written quantized and untied (its Conv1D blocks kept BF16: the formats
    quantize nn.Linear only, and exporting them quantized raises, naming the module)."""
    _, sampler, _ = planned_sampler("llama", "nvfp4", overrides={"model.layers.*.mlp.*": {"fprop": "mxfp8"}})
    path = autoprec.export(sampler, tmp_path / "mixed")
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "mixed-precision"
    assert {g["format"] for g in qc["config_groups"].values()} == {"nvfp4-pack-quantized", "mxfp8-quantized"}
    weights = decompressed(path)
    linears = export_plan(sampler, "plan").weights
    assert len(weights) == 15 and sum(q.fmt == "mxfp8" for q in linears) == 6
    for q in linears:  # MXFP8 exactly; NVFP4 as compressed-tensors decompresses it, in bf16
        want = q.weight_values() if q.fmt == "mxfp8" else q.weight_values().bfloat16()
        assert torch.equal(weights[q.module].to(want.dtype), want), q.module

    _, gpt2, _ = planned_sampler("gpt2", "nvfp4")
    with pytest.raises(ValueError, match=r"'transformer.h.0.attn.c_attn' is a Conv1D, not an nn.Linear"):
        autoprec.export(gpt2, tmp_path / "conv1d")
    _, gpt2, _ = planned_sampler("gpt2", "nvfp4", overrides={"transformer.h.*": {"fprop": "bf16"}})
    path = autoprec.export(gpt2, tmp_path / "gpt2")
    config = json.loads((path / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and "lm_head" in (path / "README.md").read_text()
    tensors = load_file(path / "model.safetensors")
    assert "lm_head.weight_packed" in tensors and "transformer.wte.weight" in tensors
    assert torch.equal(load(path).lm_head.weight.detach().bfloat16(),
                       export_plan(gpt2, "plan").weights[0].weight_values().bfloat16())


def test_fp8_block_is_written_as_compressed_tensors_fp8_block(tmp_path):
    """Hopper's recipe: 128x128-tiled weights as the FP8 block scheme (strategy block, fp32 tile scales), weights
    whose rows take no tiles (the 64-row k/v projections) as 1x128 groups, inputs dynamic per 128 values; every
    weight decompresses to autoprec's dequantized values exactly. ModelOpt's export refuses it, naming the module."""
    policy = tiny_model("llama", hidden=128)
    sampler = compile_sampler(policy, "fp8_block", hardware="h100")
    ids, mask = prompts(batch=3, max_len=5, vocab=policy.config.vocab_size)
    sample(sampler, ids, mask, new_tokens=2)
    path = autoprec.export(sampler, tmp_path / "fp8")
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    groups = {g["weights"]["strategy"]: g for g in qc["config_groups"].values()}
    assert set(groups) == {"block", "group"} and qc["format"] == "float-quantized"
    assert groups["block"]["weights"]["block_structure"] == [128, 128]
    assert groups["group"]["weights"]["group_size"] == 128
    assert all(g["input_activations"]["dynamic"] is True and g["input_activations"]["group_size"] == 128
               for g in groups.values())
    assert all(m.endswith(("k_proj", "v_proj")) for m in groups["group"]["targets"])
    weights = decompressed(path)
    linears = export_plan(sampler, "plan").weights
    assert len(weights) == len(linears) == 15  # 7 per layer and the head
    for q in linears:
        assert torch.equal(weights[q.module].to(torch.float32), q.weight_values()), q.module
    assert "FP8-block inputs are quantized by the engine" in (path / "README.md").read_text()
    with pytest.raises(ValueError, match=r"'model.layers.0.self_attn.q_proj' runs fp8_block, which the ModelOpt"):
        autoprec.export(sampler, tmp_path / "modelopt", format="modelopt")


def test_what_cannot_be_exported_raises(tmp_path):
    """A pretraining plan's dynamic NVFP4 activation scales raise, naming the module, unless weights only are
    exported (compressed-tensors)."""
    pretrain = tiny_model("llama")
    compiled = torch.compile(pretrain, backend="autoprec", options={"recipe": "nvfp4"})
    ids, mask = prompts(batch=2, max_len=5, vocab=pretrain.config.vocab_size)
    compiled(ids, attention_mask=mask, labels=ids).loss.backward()
    with pytest.raises(ValueError, match=r"'model.layers.0.self_attn.q_proj' runs NVFP4 with a dynamic activation"):
        autoprec.export(compiled, tmp_path / "dynamic")
    weights_only = autoprec.export(compiled, tmp_path / "weights", activations="none")
    groups = json.loads((weights_only / "config.json").read_text())["quantization_config"]["config_groups"]
    assert [g["input_activations"] for g in groups.values()] == [None]
    with pytest.raises(ValueError, match="ModelOpt's NVFP4 and MXFP8 quantize the input too"):
        autoprec.export(compiled, tmp_path / "mo", format="modelopt", activations="none")


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_experts_are_written_per_expert_under_the_checkpoint_names(kind, tmp_path):
    """transformers holds each experts projection as one 3D parameter; the checkpoint has one module per expert
    and projection, as the model's own checkpoints name them (gate and up split, Mixtral's w1 / w3 / w2 under
    ``block_sparse_moe``), each expert's weight quantized on its own as the grouped GEMM quantizes it, the fused
    gate-up's two halves sharing its tensor scale. compressed-tensors decompresses every expert module to
    autoprec's dequantized weight rounded to bf16, bit for bit, and transformers loads the directory, merging the
    experts back (its experts path leaves out NVFP4's global scales, so its values are not compared: docs/export.md).
    Routers are transformers' router modules, not Linears: a plan that quantizes one raises, so these keep them BF16."""
    if kind == "mixtral":
        import transformers

        torch.manual_seed(0)
        cfg = transformers.MixtralConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=32,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                         num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128,
                                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
        policy = transformers.MixtralForCausalLM(cfg).eval()
        sampler = compile_sampler(policy, "nvfp4", overrides=ROUTERS_BF16)
        ids, mask = prompts(batch=3, max_len=5, vocab=256)
        sample(sampler, ids, mask, new_tokens=2)
    else:
        _, sampler, _ = planned_sampler(kind, "nvfp4", overrides=ROUTERS_BF16)
    path = autoprec.export(sampler, tmp_path / kind)
    tensors = load_file(path / "model.safetensors")
    experts = [q for q in export_plan(sampler, "plan").weights if q.codes.ndim == 3]
    assert len(experts) == 4  # two projections per layer
    names = {"qwen3_moe": ("mlp.experts.3.gate_proj", "mlp.experts.3.up_proj", "mlp.experts.3.down_proj"),
             "mixtral": ("block_sparse_moe.experts.3.w1", "block_sparse_moe.experts.3.w3",
                         "block_sparse_moe.experts.3.w2")}[kind]
    for name in names:
        assert tensors[f"model.layers.1.{name}.weight_packed"].dtype == torch.uint8, name
    gate, up = (tensors[f"model.layers.1.{n}.weight_global_scale"] for n in names[:2])
    assert torch.equal(gate, up) and torch.equal(gate, 1 / experts[2].s_dec[3:4])
    weights = decompressed(path)
    for q in experts:  # transformers' own split of each fused parameter, applied to autoprec's dequantized values
        for module, want in checkpoint_names(sampler, {q.param: q.weight_values()}).items():
            name = module.removesuffix(".weight")
            assert torch.equal(weights[name].to(torch.bfloat16), want.bfloat16()), name
    loaded = load(path).state_dict()  # transformers loads it and merges the experts back
    assert all(loaded[q.param].shape == q.weight_values().shape for q in experts)


def test_export_example_runs(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "examples/export_sampler.py", "--out", str(tmp_path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "100.00% of their elements equal autoprec's rounded to bf16" in out.stdout
