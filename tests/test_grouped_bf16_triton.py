"""Unquantized experts GEMMs (and batches of experts) in one Triton launch (kernels/triton/grouped_bf16.py), where
torch's grouped GEMM would loop on the host (sm_80, sm_89, sm_120; an fp32 output), in the interpreter: each
group's product equals the per-group loop up to accumulation order, what no group writes is zero, and nothing is
read on the host."""
import pytest
import torch

pytest.importorskip("triton")

from autoprec.kernels.dispatch.grouped_mm import grouped_mm
from autoprec.kernels.dispatch.grouped_route import grouped_route
from autoprec.kernels.triton.grouped_bf16 import bf16_grouped_problem

from helpers import record_calls, stand_in_gpu
from test_no_host_sync import HostReads

BF16, FP32 = torch.bfloat16, torch.float32
OFFS = torch.tensor([5, 5, 150, 160, 291], dtype=torch.int32)  # an empty expert, one past 128 tokens
T = 300  # nine tokens past the last offset


def operands(layout: str, dtype: torch.dtype = BF16):
    gen = torch.Generator().manual_seed(0)
    if layout == "2d3d":
        return torch.randn(T, 48, generator=gen).to(dtype), torch.randn(5, 48, 40, generator=gen).to(dtype)
    if layout == "3d3d":  # a batch of 5 experts, 60 tokens each
        return torch.randn(5, 60, 48, generator=gen).to(dtype), torch.randn(5, 48, 40, generator=gen).to(dtype)
    return torch.randn(T, 48, generator=gen).to(dtype).t(), torch.randn(T, 40, generator=gen).to(dtype)  # a wgrad


@pytest.fixture
def poisoned_empty(monkeypatch):
    """torch.empty with NaN in every float tensor, as a GPU's uninitialized memory may hold."""
    real = torch.empty

    def empty(*args, **kwargs):
        out = real(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty", empty)


@pytest.mark.parametrize("layout", ["2d3d", "2d2d", "3d3d"])
@pytest.mark.parametrize("fmt,dtype,out_dtype", [("exact", BF16, BF16), ("exact", BF16, FP32), ("bf16", FP32, FP32),
                                                 ("bf16", FP32, BF16)])
def test_sm80_bf16_experts_gemm_in_one_launch_equals_the_loop(monkeypatch, poisoned_empty, layout, fmt, dtype,
                                                              out_dtype):
    """On sm_80 (stood in for), fprop, wgrad and a batch of experts run the one-launch kernel, read nothing on the
    host, and equal the CPU's per-group loop (fp32 accumulation, one rounding); the rows past the last offset and
    the empty expert's gradient are zero."""
    a, b = operands(layout, dtype)
    offs = None if layout == "3d3d" else OFFS
    want = grouped_mm(a, b, offs, fmt, out_dtype=out_dtype)
    stand_in_gpu(monkeypatch, (8, 0))
    route = grouped_route(a.device, layout, fmt, (a.dtype, b.dtype), (a.shape, b.shape), len(OFFS), False, out_dtype)
    assert (route.kind, route.host_read) == ("triton_bf16", None)
    with HostReads() as rec:
        got = grouped_mm(a, b, offs, fmt, out_dtype=out_dtype)
    assert rec.found == [] and got.dtype == out_dtype and got.shape == want.shape
    if layout == "2d3d":
        assert not got[int(OFFS[-1]):].any()
    elif layout == "2d2d":
        assert not got[1].any()
    tol = 2**-7 if out_dtype == BF16 else 1e-5
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * want.float().abs().max().item())


@pytest.mark.parametrize("capability,exact,dtypes,out_dtype,why", [
    ((8, 0), True, (BF16, BF16), BF16, None),
    ((12, 0), False, (FP32, BF16), FP32, None),
    (None, True, (BF16, BF16), FP32, None),  # the interpreter
    ((7, 5), True, (BF16, BF16), BF16, "no bf16 tensor-core MMA"),
    ((9, 0), True, (FP32, FP32), FP32, "the kernels multiply bf16"),
    ((9, 0), False, (BF16, BF16), torch.float16, "float32 or bfloat16"),
])
def test_sm80_bf16_grouped_problem_table(capability, exact, dtypes, out_dtype, why):
    """Any layout (2d x 3d, 2d x 2d, a 3d x 3d batch) runs; what stops the kernels is the GPU or the dtypes."""
    problem = bf16_grouped_problem(capability, exact, dtypes, out_dtype)
    assert problem is None if why is None else why in problem


def test_exact_loop_accumulates_in_a_wider_output():
    """The per-group loop (the CPU's) of an ``exact`` bf16 product into fp32 is each group's fp32 product, not the
    bf16 product widened (what torch's grouped GEMM computes where it writes fp32, and the one-launch kernel does)."""
    a, b = operands("2d3d")
    got = grouped_mm(a, b, OFFS, "exact", out_dtype=FP32)
    bounds = list(zip([0] + OFFS.tolist()[:-1], OFFS.tolist()))
    for g, (s, e) in enumerate(bounds):
        assert torch.equal(got[s:e], a[s:e].float() @ b[g].float())


def test_sm80_compiled_moe_step_runs_its_bf16_experts_in_one_launch_each(monkeypatch, fresh_dynamo):
    """End to end, an MoE block under the ``bf16`` recipe compiled for an A100 (stood in for): every experts GEMM of
    the step (fprop and dgrad of both projections, 2d x 3d; both wgrads, 2d x 2d) runs one Triton launch, and the
    gradients equal the same step on the CPU's per-group loop."""
    from test_moe import MoEBlock

    from autoprec.kernels.triton import grouped_mm as grouped_mm_triton
    from autoprec.kernels.triton import wgrad_bf16 as wgrad_bf16_triton

    def step(seed_model: MoEBlock) -> list[torch.Tensor]:
        model = MoEBlock().bfloat16()
        model.load_state_dict(seed_model.state_dict())
        ids = torch.randint(0, 16, (95,), generator=torch.Generator().manual_seed(0))
        torch.compile(model, backend="autoprec", options={"recipe": "bf16"})(ids).float().pow(2).mean().backward()
        return [p.grad for p in model.parameters()]

    torch.manual_seed(0)
    seed_model = MoEBlock().bfloat16()
    want = step(seed_model)
    torch._dynamo.reset()
    stand_in_gpu(monkeypatch, (8, 0))
    launches = []
    record_calls(monkeypatch, grouped_mm_triton, "launch_grouped", launches)
    record_calls(monkeypatch, wgrad_bf16_triton, "bf16_wgrad", launches)
    got = step(seed_model)
    assert sorted(name for name, _ in launches) == ["bf16_wgrad"] * 2 + ["launch_grouped"] * 4
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=2**-7, atol=1e-3 * w.float().abs().max().item())
