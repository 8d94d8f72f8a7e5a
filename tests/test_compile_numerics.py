"""Compiled numerics: equal, bit for bit, to eager code that quantizes the same operands the same way."""
import pytest
import torch
import torch.nn.functional as F

import autoprec
from autoprec.planner.model_planner import PLANNERS

from gpt_model import MLP, TinyGPT, tokens
from helpers import RecordedKernel, bits_equal, sqnr_db
from reference_autograd import qlinear

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.fixture
def rewritten(monkeypatch) -> list:
    """The graph modules the rewrite pass produced during the test."""
    from autoprec import pipeline

    graphs = []
    orig = pipeline.rewrite_matmuls

    def spy(gm, *args):
        out = orig(gm, *args)
        graphs.append(gm)
        return out

    monkeypatch.setattr(pipeline, "rewrite_matmuls", spy)
    return graphs


def reference_mlp(m: MLP, x: torch.Tensor, fmt: str) -> torch.Tensor:
    return qlinear(F.gelu(qlinear(x, m.fc1, fmt)), m.fc2, fmt)


def grads(m) -> list[torch.Tensor]:
    out = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    return out


@pytest.mark.parametrize("recipe", ["bf16", "mxfp8", "nvfp4"])
def test_mlp_loss_and_grads_equal_reference(recipe):
    torch.manual_seed(0)
    m = MLP()
    x = torch.randn(4, 16, 32)
    loss = torch.compile(m, backend="autoprec", options={"recipe": recipe})(x).pow(2).mean()
    loss.backward()
    got = grads(m)
    want_loss = reference_mlp(m, x, recipe).pow(2).mean()
    want_loss.backward()
    assert bits_equal(loss.detach(), want_loss.detach())
    for g, w in zip(got, grads(m)):
        assert bits_equal(g, w)


def test_nvfp4_plan_changes_the_numbers_within_its_sqnr():
    """The comparison above is not vacuous: quantization changes the numbers, by NVFP4's error."""
    torch.manual_seed(0)
    m, x = MLP(), torch.randn(4, 16, 32)
    compiled = torch.compile(m, backend="autoprec", options={"recipe": "nvfp4"})(x).detach()
    exact = m(x).detach()
    assert not torch.equal(compiled, exact)
    assert 10 < sqnr_db(exact, compiled) < 25


def test_rewritten_graph_op_counts(rewritten):
    m = torch.compile(MLP(), backend="autoprec", options={"recipe": "nvfp4"})
    m(torch.randn(4, 16, 32)).sum().backward()
    ops = [n.target for g in rewritten for n in g.graph.nodes if n.op == "call_function"]
    names = [str(t) for t in ops]
    assert names.count("autoprec.scaled_mm.default") == 5
    # two operands per GEMM: 4 tensors quantized both ways (x, gelu(h), dy, fc2's weight), 2 once
    assert names.count("autoprec.quantize.default") == 2 and names.count("autoprec.quantize_dual.default") == 4
    assert not any(t in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default) for t in ops)
    tags = [n.meta["autoprec"] for g in rewritten for n in g.graph.nodes if "autoprec" in n.meta]
    assert {t["role"] for t in tags} == {"fprop", "dgrad", "wgrad"}


def test_odd_shapes_fall_back_to_bf16_with_reason():
    layer = torch.nn.Linear(24, 40)  # K = 24 is no multiple of 16 or 32
    m = torch.compile(layer, backend="autoprec", options={"recipe": "nvfp4"})
    x = torch.randn(32, 24, requires_grad=True)
    m(x).sum().backward()
    plan = autoprec.plan(m)
    by_role = {str(d.role): d for d in plan.decisions}
    assert by_role["fprop"].fmt == "bf16" and "K=24 is not a multiple of the nvfp4 block 16" in by_role["fprop"].reason
    assert by_role["wgrad"].fmt == "nvfp4"  # K = 32 tokens
    assert by_role["dgrad"].fmt == "bf16" and "K=40" in by_role["dgrad"].reason
    assert "BF16 instead of nvfp4" in str(plan)


def test_nan_in_input_reaches_the_loss():
    m = torch.compile(TinyGPT(), backend="autoprec", options={"recipe": "nvfp4"})
    idx, tgt = tokens()
    m.wpe.weight.data[3, 5] = float("nan")
    assert torch.isnan(m(idx, tgt))


def test_quantized_saved_activations_shrink():
    saved = {}
    for recipe in ("bf16", "mxfp8", "nvfp4"):
        torch._dynamo.reset()
        PLANNERS.clear()
        m = torch.compile(TinyGPT(), backend="autoprec", options={"recipe": recipe})
        m(*tokens()).backward()
        saved[recipe] = sum(autoprec.plan(m).saved_bytes.values())
    assert saved["nvfp4"] < saved["mxfp8"] < saved["bf16"]


def test_gpt_bf16_loss_close_to_fp32_eager():
    torch.manual_seed(0)
    model, (idx, tgt) = TinyGPT(), tokens()
    loss = torch.compile(model, backend="autoprec", options={"recipe": "bf16"})(idx, tgt)
    assert abs(loss.item() - model(idx, tgt).item()) < 2e-2


@pytest.mark.parametrize("recipe", ["bf16", "mxfp8", "nvfp4", "nvfp4_nvidia", "auto"])
def test_inductor_inner_matches_graph_modules(recipe):
    """Every recipe runs under inductor (its decompositions included) with the numerics of the GraphModules."""
    results = []
    for inner in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        m, x = MLP(), torch.randn(2, 16, 32, requires_grad=True)
        c = torch.compile(m, backend="autoprec", options={"recipe": recipe, "inner": inner})
        for _ in range(2):  # auto: calibration, then the plan
            y = c(x)
            y.pow(2).mean().backward()
        results.append((y.detach(), x.grad, m.fc1.weight.grad))
    for want, got in zip(*results):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4"])
def test_only_nvfp4_tensor_scales_reach_the_matmuls(rewritten, recipe):
    """MXFP8 has no tensor scale: no node reads the quantize op's third part (an empty tensor), so no graph saves or
    partitions it (saved for backward, the partitioner had run a quantization in the forward for its empty part
    alone); NVFP4's matmuls read theirs."""
    torch.manual_seed(0)
    m = MLP()
    torch.compile(m, backend="autoprec", options={"recipe": recipe})(torch.randn(2, 16, 32)).sum().backward()
    ops = {torch.ops.autoprec.quantize.default: (2,), torch.ops.autoprec.quantize_dual.default: (2, 5)}
    read = [u.args[1] in ops[n.target] for g in rewritten for n in g.graph.nodes if n.target in ops for u in n.users]
    assert len(read) >= 8 and any(read) == (recipe == "nvfp4")


@pytest.mark.parametrize("recipe", ["nvfp4", "nvfp4_nvidia", "mxfp8"])
def test_partitioner_runs_each_quantization_once(monkeypatch, recipe):
    """The forward and backward graphs AOTAutograd's partitioner cuts from a GPT's joint graph hold its autoprec ops
    once each: none is run in both (a recomputation) or left out."""
    from autoprec import inner_compiles, pipeline

    joint, parts = [], []
    pair = pipeline.pair_quantizations
    monkeypatch.setattr(pipeline, "pair_quantizations", lambda gm: joint.append(gm) or pair(gm))
    once = inner_compiles.compile_once
    monkeypatch.setattr(inner_compiles, "compile_once",
                        lambda compiler, settings: once(lambda g, ex: parts.append(g) or compiler(g, ex), settings))
    torch.manual_seed(0)
    c = torch.compile(TinyGPT(vocab=64, d=64, layers=1, heads=2, ctx=32), backend="autoprec",
                      options={"recipe": recipe})
    c(*tokens(batch=4, ctx=32, vocab=64)).backward()

    def ops(graphs):
        return sorted(str(n.target) for g in graphs for n in g.graph.nodes if str(n.target).startswith("autoprec."))

    assert len(joint) == 1 and len(parts) == 2 and len(ops(joint)) > 20
    assert ops(parts) == ops(joint)


def test_stochastic_rounding_draws_fresh_bits_each_step():
    """SR with the same bits every step would round each position the same way, a bias across steps."""
    torch.manual_seed(0)
    m, x = MLP(), torch.randn(4, 16, 32)
    c = torch.compile(m, backend="autoprec", options={"recipe": "nvfp4_nvidia"})
    grads_per_step = []
    for _ in range(2):
        c(x).pow(2).mean().backward()
        grads_per_step.append(m.fc1.weight.grad.clone())
        m.zero_grad()
    assert not torch.equal(grads_per_step[0], grads_per_step[1])  # same inputs, different SR bits
    assert sqnr_db(grads_per_step[0], grads_per_step[1]) > 5


def test_stochastic_rounding_bits_do_not_depend_on_other_runs():
    def first_grad():
        torch.manual_seed(0)
        m, x = MLP(), torch.randn(4, 16, 32)
        torch.compile(m, backend="autoprec", options={"recipe": "nvfp4_nvidia"})(x).pow(2).mean().backward()
        return m.fc1.weight.grad

    alone = first_grad()
    other = torch.compile(MLP(), backend="autoprec", options={"recipe": "nvfp4_nvidia"})
    for _ in range(3):
        other(torch.randn(4, 16, 32)).sum().backward()
    assert bits_equal(first_grad(), alone)


def test_transposed_16x16_tiles_are_the_quantization_of_the_transpose():
    """With 16x16 tiles the dgrad's weight (blocked along N) is the fprop's (blocked along K) transposed:
    same tiles, scales and codes, so the weight is quantized once."""
    from autoprec.kernels.dispatch import dense as dispatch
    from autoprec.kernels.ops import transpose_tiles

    w = torch.randn(48, 64) * torch.logspace(-3, 3, 64)  # tiles of very different scales
    w[5, 9] = float("nan")
    fprop = dispatch.quantize(w.t(), "nvfp4", 0, tile2d=True)  # b = Wᵀ, stored (48, 64)
    dgrad = dispatch.quantize(w, "nvfp4", 0, tile2d=True)  # b = W, stored (64, 48)
    codes, scales = transpose_tiles(fprop.codes, fprop.scales.view(torch.uint8))
    assert bits_equal(codes, dgrad.codes) and bits_equal(scales, dgrad.scales.view(torch.uint8))
    assert bits_equal(fprop.tensor_scale, dgrad.tensor_scale)


@pytest.mark.parametrize("shape", [(48, 64), (80, 208), (16, 16)])
def test_transpose_tiles_triton_is_the_references_bytes_in_one_launch(monkeypatch, shape):
    """The Triton transpose of a 16x16-tiled matrix (the interpreter, one launch; partial 64 x 64 tiles both ways)
    writes the reference's codes and scales byte for byte, on every code and scale byte."""
    from autoprec.kernels.dispatch import dense as dispatch
    from autoprec.kernels.triton import transpose_tiles as transpose_tiles_triton

    gen = torch.Generator().manual_seed(2)
    rows, k = shape
    codes = torch.randint(0, 256, (rows, k // 2), generator=gen, dtype=torch.uint8)
    scales = torch.randint(0, 256, (rows // 16, k // 16), generator=gen, dtype=torch.uint8)
    launches = []
    kernel = transpose_tiles_triton._transpose_tiles_kernel
    monkeypatch.setattr(transpose_tiles_triton, "_transpose_tiles_kernel", RecordedKernel(kernel, launches))
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    got = dispatch.transpose_tiles(codes, scales)
    monkeypatch.setenv("AUTOPREC_KERNELS", "auto")
    want = dispatch.transpose_tiles(codes, scales)  # the CPU's reference
    assert len(launches) == 1
    assert all(bits_equal(g, w) and g.is_contiguous() for g, w in zip(got, want))


def test_dgrad_reuses_the_fprop_weight_quantization(rewritten, monkeypatch):
    """nvfp4_nvidia: each 16x16-tiled weight is quantized once (its dgrad reads the transpose), and the
    loss and gradients are bit-identical to quantizing it again for the dgrad."""
    from autoprec.passes import rewrite

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        torch.manual_seed(0)
        m = MLP()
        loss = torch.compile(m, backend="autoprec", options={"recipe": "nvfp4_nvidia"})(torch.randn(4, 16, 32))
        loss.pow(2).mean().backward()
        torch._dynamo.reset()
        return loss.detach(), grads(m)

    shared, shared_grads = run()
    names = [str(n.target) for n in rewritten[-1].graph.nodes if n.op == "call_function"]
    assert names.count("autoprec.transpose_tiles.default") == 1  # fc2's dgrad (fc1 has no dgrad)
    assert names.count("autoprec.quantize.default") + 2 * names.count("autoprec.quantize_dual.default") == 9
    monkeypatch.setattr(rewrite, "_shared_weight", lambda *args: None)
    again, again_grads = run()
    assert bits_equal(shared, again)
    assert all(bits_equal(g, w) for g, w in zip(shared_grads, again_grads))
