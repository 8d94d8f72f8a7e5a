"""NVFP4's tensor amax as graph ops (passes/graph_amax.py): exactly the bits of max|x| over x's stored finite values,
which inductor can fuse into the kernel producing x; the quantize ops given it make the bytes they make without it
and launch no amax pass; compiled models keep their numbers bit for bit."""
import pytest
import torch
from torch._inductor.utils import run_and_get_code

from autoprec import pipeline
from autoprec.kernels.core.quantized import QuantCopy
from autoprec.kernels.dispatch import dense as dispatch
from autoprec.kernels.ops import quantize, quantize_dual
from autoprec.kernels.triton import quantize_dual as quantize_dual_triton
from autoprec.kernels.triton import quantize_rows as quantize_triton
from autoprec.passes.graph_amax import QUANTIZE, QUANTIZE_DUAL, op_args, takes_rht

from gpt_model import TinyGPT, tokens
from helpers import RecordedKernel, amax_edge_case, bits_equal, edge_tensor, stored_amax_bits, with_amax_bits

pytestmark = pytest.mark.usefixtures("fresh_dynamo")
STEP = torch.tensor(3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_amax_bits_are_the_stored_tensors_and_fuse_into_its_producer(dtype):
    """``amax_bits`` of x = GELU(h) * 2.99 is the bits of max|x| over x's finite values as stored, eagerly and as
    inductor compiles it, where one kernel computes the GELU once, stores x and reduces it (inductor keeps x in
    fp32 until it stores it: the ops read the stored bits, so values that round to Inf are left out as the
    quantizer's amax pass leaves them out)."""
    fn, h = amax_edge_case(dtype)
    gm = with_amax_bits(fn, h)
    x, bits = gm(h)
    assert bits.dtype == torch.int32 and bits.item() == stored_amax_bits(x)
    (x, bits), (code,) = run_and_get_code(torch.compile(gm, backend="inductor"), h)
    assert bits.item() == stored_amax_bits(x)
    kernels = [k for k in code.split("async_compile.cpp_pybinding(")[1:] if "erf" in k]  # the GELU's
    assert len(kernels) == 1 and kernels[0].count("erf(") == 1 and "tmp_acc" in kernels[0]  # computed once, reduced
    assert with_amax_bits(lambda h: torch.zeros_like(h) * float("nan"), h)(h)[1].item() == 0  # no finite value


@pytest.mark.parametrize("tile2d", [False, True])
@pytest.mark.parametrize("axis", [1, 0], ids=["rows", "cols"])
def test_quantize_given_the_amax_makes_its_bytes_without_an_amax_pass(monkeypatch, axis, tile2d):
    """The quantize op given x's amax bits (Triton, in the interpreter) returns the bytes it returns without them,
    rowwise, read down columns and in 16x16 tiles, and launches no amax pass."""
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    x = edge_tensor(64, 96).bfloat16()
    bits = torch.tensor(stored_amax_bits(x), dtype=torch.int32)
    want = quantize(x, "nvfp4", axis, "sr", 5, tile2d, "rceil", False, 0, STEP)
    launches = []
    monkeypatch.setattr(quantize_triton, "_amax_kernel", RecordedKernel(quantize_triton._amax_kernel, launches))
    got = quantize(x, "nvfp4", axis, "sr", 5, tile2d, "rceil", False, 0, STEP, bits)
    assert not launches and all(bits_equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("gpu_copies", [False, True], ids=["one-read", "two-quantizations"])
@pytest.mark.parametrize("a,b", [
    (("sr", 2, False, False), ("sr", 3, False, True)),  # a gradient: the wgrad copy read through a transpose
    (("rne", 4, False, True), ("rne", 5, False, False)),  # a weight seen as Wᵀ by fprop
], ids=["gradient", "weight"])
def test_quantize_dual_given_the_amax_makes_its_bytes_without_an_amax_pass(monkeypatch, gpu_copies, a, b):
    """quantize_dual given the amax bits makes both copies' bytes as without them, in the one-read kernel and in the
    two quantizations a GPU runs, and launches no amax pass."""
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    if gpu_copies:
        monkeypatch.setattr(dispatch, "quantize_dual", dispatch.quantize_copies)
    x = edge_tensor(64, 96, seed=3)
    bits = torch.tensor(stored_amax_bits(x), dtype=torch.int32)
    want = quantize_dual(x, "nvfp4", *a, *b, "rceil", 0, STEP)
    launches = []
    for module, name in ((quantize_dual_triton, "_amax2_kernel"), (quantize_triton, "_amax_kernel")):
        monkeypatch.setattr(module, name, RecordedKernel(getattr(module, name), launches))
    got = quantize_dual(x, "nvfp4", *a, *b, "rceil", 0, STEP, bits)
    assert not launches and all(bits_equal(g, w) for g, w in zip(got, want))


def test_a_given_amax_is_checked():
    """A given amax is NVFP4's, of the tensor itself (not of its RHT), in one int32: else an error naming it."""
    x, bits = torch.randn(32, 32), torch.zeros((), dtype=torch.int32)
    with pytest.raises(ValueError, match="amax=.*format mxfp8"):
        dispatch.quantize(x, "mxfp8", amax=bits)
    with pytest.raises(ValueError, match="amax=.*with the RHT"):
        dispatch.quantize_dual(x, "nvfp4", QuantCopy(), QuantCopy(rht=True), amax=bits)
    with pytest.raises(ValueError, match="amax=.*one int32, got torch.float32"):
        dispatch.quantize(x, "nvfp4", amax=bits.float())


def _compiled_step(recipe: str, inner: str, backward: bool = True) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Loss and gradients of one step of a small bf16 GPT compiled under ``recipe`` (2 blocks: nvfp4_nvidia keeps
    the last in BF16)."""
    torch.manual_seed(0)
    model = TinyGPT(vocab=128, d=32, layers=2, heads=2, ctx=32).to(torch.bfloat16)
    idx, tgt = tokens(batch=2, ctx=32, vocab=128)
    compiled = torch.compile(model, backend="autoprec", options={"recipe": recipe, "inner": inner})
    loss = compiled(idx, tgt)
    if backward:
        loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("recipe", ["nvfp4", pytest.param("nvfp4_nvidia", marks=pytest.mark.slow)])
def test_compiled_steps_take_graph_amaxes_bit_for_bit(monkeypatch, recipe):
    """Under inductor with the Triton quantizers, every NVFP4 quantization without the RHT takes its amax from the
    graph (the RHT copies of ``nvfp4_nvidia`` keep their own pass), and a step's loss and gradients are those of
    the same step without the pass, bit for bit; under aot_eager (where the ops would run one by one) no
    quantization takes one."""
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    graphs = []
    amaxes = pipeline.graph_amaxes
    monkeypatch.setattr(pipeline, "graph_amaxes", lambda gm: graphs.append(gm) or amaxes(gm))
    loss, grads = _compiled_step(recipe, "inductor")
    quantizations = [n for g in graphs for n in g.graph.nodes if n.target in (QUANTIZE, QUANTIZE_DUAL)]
    args = {n: op_args(n) for n in quantizations}
    rht = {n: takes_rht(args[n]) for n in quantizations}
    assert quantizations and all(("amax" in args[n]) != rht[n] for n in quantizations)
    assert any(rht.values()) == (recipe == "nvfp4_nvidia")
    torch._dynamo.reset()
    monkeypatch.setattr(pipeline, "graph_amaxes", lambda gm: 0)
    want_loss, want_grads = _compiled_step(recipe, "inductor")
    assert bits_equal(loss, want_loss) and all(bits_equal(g, w) for g, w in zip(grads, want_grads))
    torch._dynamo.reset()
    graphs.clear()
    monkeypatch.setattr(pipeline, "graph_amaxes", lambda gm: graphs.append(gm))
    _compiled_step(recipe, "aot_eager", backward=False)
    assert not graphs
