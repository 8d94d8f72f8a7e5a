"""Pairing: a tensor's rowwise and columnwise quantizations become one quantize_dual node, whose bytes
are the two quantize nodes' (through transposes too), so compiled models compute the same bits."""
import pytest
import torch

from autoprec import backend
from autoprec.kernels import dispatch, quantize_cols_triton, quantize_triton, rht_signs
from autoprec.kernels.ops import quantize, quantize_dual
from autoprec.kernels.quantized import QuantCopy
from autoprec.kernels.random_bits import StepStream

from gpt_model import MLP
from helpers import bits_equal, edge_tensor

pytestmark = pytest.mark.usefixtures("fresh_dynamo")
STEP = torch.tensor(7)


@pytest.mark.parametrize("kernels", ["auto", "triton"], ids=["cpu", "triton-interpreter"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
@pytest.mark.parametrize("a,b", [
    (("rne", 0, False, False), ("rne", 1, True, False)),  # an activation: fprop rows, wgrad columns + RHT
    (("sr", 2, False, False), ("sr", 3, True, True)),  # a gradient: the wgrad copy read through a transpose
    (("rne", 4, False, True), ("rne", 5, False, False)),  # a weight seen as Wᵀ by fprop
], ids=["activation", "gradient", "weight"])
def test_dual_op_makes_the_bytes_of_two_quantize_ops(monkeypatch, kernels, fmt, a, b):
    monkeypatch.setenv("AUTOPREC_KERNELS", kernels)
    x = edge_tensor(64, 96)
    got = quantize_dual(x, fmt, *a, *b, "rceil", 0, STEP)
    for (rounding, seed, rht, transposed), axis, parts in ((a, 1, got[:3]), (b, 0, got[3:])):
        src, axis = (x.t(), 1 - axis) if transposed else (x, axis)
        want = quantize(src, fmt, axis, rounding, seed, False, "rceil", rht, 0, STEP)
        assert all(bits_equal(g, w) for g, w in zip(parts, want))


@pytest.mark.parametrize("a,b", [
    (QuantCopy(StepStream(2, STEP)), QuantCopy(StepStream(3, STEP), transposed_source=True)),  # a gradient
    (QuantCopy(transposed_source=True), QuantCopy()),  # a weight seen as Wᵀ by fprop
    (QuantCopy(), QuantCopy(rht=True)),  # an activation, RHT on its wgrad copy: its amax is the transform's
], ids=["gradient", "weight", "activation-rht"])
def test_copies_a_gpu_runs_share_the_tensor_amax(monkeypatch, a, b):
    """The two quantizations a GPU runs for a pair (``quantize_copies``, Triton in the interpreter) make the bytes
    of two quantize calls, and read x once for NVFP4's tensor amax where neither copy takes the RHT."""
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    launches = []
    for module, name in ((quantize_triton, "launch_amax"), (quantize_cols_triton, "launch_rht_amax")):
        launch = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *args, f=launch, **kw: launches.append(1) or f(*args, **kw))
    x = edge_tensor(64, 96)
    got = dispatch.quantize_copies(x, "nvfp4", a, b, rht_signs=rht_signs(0))
    assert len(launches) == (2 if b.rht else 1)
    for copy, axis, q in ((a, 1, got[0]), (b, 0, got[1])):
        src, axis = copy.source(x, axis)
        want = dispatch.quantize(src, "nvfp4", axis, rounding="rne" if copy.seed is None else "sr",
                                 seed=copy.seed or 0, rht=copy.rht, rht_signs=rht_signs(0))
        assert bits_equal(q.codes.view(torch.uint8), want.codes.view(torch.uint8))
        assert bits_equal(q.scales, want.scales) and bits_equal(q.tensor_scale, want.tensor_scale)


def run_mlp(recipe: str) -> tuple[list[torch.Tensor], list[str]]:
    """Loss and gradients of a compiled MLP step, and the autoprec ops of its joint graph."""
    graphs = []
    orig = backend.pair_quantizations
    backend.pair_quantizations = lambda gm: graphs.append(gm) or orig(gm)
    try:
        torch.manual_seed(0)
        m = MLP()
        loss = torch.compile(m, backend="autoprec", options={"recipe": recipe})(torch.randn(4, 16, 32))
        loss.pow(2).mean().backward()
    finally:
        backend.pair_quantizations = orig
    torch._dynamo.reset()
    names = [str(n.target) for g in graphs for n in g.graph.nodes if str(n.target).startswith("autoprec.")]
    return [loss.detach(), *(p.grad for p in m.parameters())], names


@pytest.mark.parametrize("recipe, pairs", [("nvfp4", 4), ("mxfp8", 4), ("nvfp4_nvidia", 3)])
def test_paired_models_compute_the_same_bits(monkeypatch, recipe, pairs):
    """fc1 and fc2: the activation and output-gradient pairs, and 1x16 / 1x32 weights (fc1 has no dgrad;
    16x16 weights are shared by transposing tiles instead); the step's bits equal the unpaired graph's."""
    paired, names = run_mlp(recipe)
    assert names.count("autoprec.quantize_dual.default") == pairs
    monkeypatch.setattr(backend, "pair_quantizations", lambda gm: 0)
    unpaired, names = run_mlp(recipe)
    assert "autoprec.quantize_dual.default" not in names
    assert all(bits_equal(p, u) for p, u in zip(paired, unpaired))
