"""Pairing: a tensor's rowwise and columnwise quantizations become one quantize_dual node, whose bytes
are the two quantize nodes' (through transposes too), so compiled models compute the same bits."""
import pytest
import torch
import triton

from autoprec import pipeline
from autoprec.kernels import rht_ref, rht_signs
from autoprec.kernels.core.quantized import QuantCopy
from autoprec.kernels.core.random_bits import StepStream
from autoprec.kernels.dispatch import dense as dispatch
from autoprec.kernels.ops import quantize, quantize_dual
from autoprec.kernels.triton import quantize_cols as quantize_cols_triton
from autoprec.kernels.triton import quantize_rows as quantize_triton

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
    (QuantCopy(StepStream(2, STEP)), QuantCopy(StepStream(3, STEP), rht=True, transposed_source=True)),
    (QuantCopy(rht=True), QuantCopy()),
], ids=["gradient", "weight", "activation-rht", "gradient-rht", "rows-rht"])
def test_copies_a_gpu_runs_share_the_tensor_amax(monkeypatch, a, b):
    """The two quantizations a GPU runs for a pair (``quantize_copies``, Triton in the interpreter) make the bytes
    of two quantize calls, and read x once for NVFP4's tensor amaxes: one amax where neither copy takes the RHT,
    and with the RHT on one copy (read down a strided dim or, for a transposed source, along rows) its transform's
    and x's from the same pass."""
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    launches = []
    for module, name in ((quantize_triton, "launch_amax"), (quantize_cols_triton, "launch_rht_amax")):
        launch = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *args, f=launch, **kw: launches.append(1) or f(*args, **kw))
    x = edge_tensor(64, 96)
    got = dispatch.quantize_copies(x, "nvfp4", a, b, rht_signs=rht_signs(0))
    assert len(launches) == 1
    for copy, axis, q in ((a, 1, got[0]), (b, 0, got[1])):
        src, axis = copy.source(x, axis)
        want = dispatch.quantize(src, "nvfp4", axis, rounding="rne" if copy.seed is None else "sr",
                                 seed=copy.seed or 0, rht=copy.rht, rht_signs=rht_signs(0))
        assert bits_equal(q.codes.view(torch.uint8), want.codes.view(torch.uint8))
        assert bits_equal(q.scales, want.scales) and bits_equal(q.tensor_scale, want.tensor_scale)


@pytest.mark.parametrize("where", [(0, 0), (63, 95), (17, 40), (40, 17)])
@pytest.mark.parametrize("rht_rows", [False, True], ids=["rht-cols", "rht-rows"])
def test_pair_amax_reads_both_tensor_amaxes_at_once(monkeypatch, where, rht_rows):
    """``quantize_cols_triton.pair_amax`` of a pair with the RHT on one copy: the bits of max|x| and of max|RHT(x)|
    along that copy's K (over the finite values), wherever the largest value lies (first and last element,
    mid-block: each slice's column counts), with 3 programs folding the 12 tiles of 16 x 32 (the interpreter's
    tile, set so here)."""
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    monkeypatch.setattr(quantize_cols_triton, "AMAX_PROGRAMS", 3)
    monkeypatch.setattr(quantize_cols_triton, "INTERPRETER_TILE", triton.Config({"BR": 16, "BK": 32}))
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(1))
    x[where] = -20.0
    x[5, 5] = float("inf")
    copies = (QuantCopy(rht=True), QuantCopy()) if rht_rows else (QuantCopy(), QuantCopy(rht=True))
    cells = quantize_cols_triton.pair_amax(x, *copies, rht_signs(0))
    transformed = rht_ref(x, 1 if rht_rows else 0, rht_signs(0))  # the Inf's 16-group is not finite
    want = {False: x[x.isfinite()].abs().max(), True: transformed[transformed.isfinite()].abs().max()}
    for copy, cell in zip(copies, cells):
        assert cell.item() == want[copy.rht].view(torch.int32).item(), (copy, cell, want[copy.rht])


def run_mlp(recipe: str) -> tuple[list[torch.Tensor], list[str]]:
    """Loss and gradients of a compiled MLP step, and the autoprec ops of its joint graph."""
    graphs = []
    orig = pipeline.pair_quantizations
    pipeline.pair_quantizations = lambda gm: graphs.append(gm) or orig(gm)
    try:
        torch.manual_seed(0)
        m = MLP()
        loss = torch.compile(m, backend="autoprec", options={"recipe": recipe})(torch.randn(4, 16, 32))
        loss.pow(2).mean().backward()
    finally:
        pipeline.pair_quantizations = orig
    torch._dynamo.reset()
    names = [str(n.target) for g in graphs for n in g.graph.nodes if str(n.target).startswith("autoprec.")]
    return [loss.detach(), *(p.grad for p in m.parameters())], names


@pytest.mark.parametrize("recipe, pairs", [("nvfp4", 4), ("mxfp8", 4), ("nvfp4_nvidia", 3)])
def test_paired_models_compute_the_same_bits(monkeypatch, recipe, pairs):
    """fc1 and fc2: the activation and output-gradient pairs, and 1x16 / 1x32 weights (fc1 has no dgrad;
    16x16 weights are shared by transposing tiles instead); the step's bits equal the unpaired graph's."""
    paired, names = run_mlp(recipe)
    assert names.count("autoprec.quantize_dual.default") == pairs
    monkeypatch.setattr(pipeline, "pair_quantizations", lambda gm: 0)
    unpaired, names = run_mlp(recipe)
    assert "autoprec.quantize_dual.default" not in names
    assert all(bits_equal(p, u) for p, u in zip(paired, unpaired))
