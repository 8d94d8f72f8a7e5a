"""Batched block-scaled products (kernels/dispatch/batched.py; planned bmm: eager attention, batched experts):
on each GPU
path one grouped GEMM of B equal groups, not one GEMM per batch item, equal to the reference's fp32 batched matmul up
to accumulation order, reading nothing on the host; Triton in the interpreter, GPUs stood in for."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from autoprec.kernels import scaled_mm
from autoprec.kernels.core.operand import Operand
from autoprec.kernels.dispatch import dense as dispatch
from autoprec.kernels.dispatch import grouped as grouped_dispatch

from helpers import grouped_paths_on_stand_in_gpu, record_calls, stand_in_gpu
from test_no_host_sync import HostReads
from test_sm100_grouped_native import calls as native_calls
from test_sm100_grouped_native import fake_scaled_grouped_mm

B, M, K, N = 3, 40, 64, 48


def operands(fmt: str | None):
    """a (B, M, K) and b (B, K, N), items of very different magnitudes, quantized along K (bf16 where fmt is None)."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(B, M, K, generator=gen), torch.randn(B, K, N, generator=gen)
    b[1] *= 300.0
    if fmt is None:
        return a.bfloat16(), b.bfloat16()
    return dispatch.quantize(a, fmt, 2, rounding="sr", seed=3), dispatch.quantize(b, fmt, 1)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal to the fp32 reference up to accumulation order (and one rounding, for bf16)."""
    rtol = 2**-8 if got.dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.float(), want, rtol=rtol, atol=rtol * float(want.abs().max()))


def run_batched(monkeypatch, fmt: str, bias: bool, out_dtype: torch.dtype) -> tuple[torch.Tensor, list]:
    """The product on the current (stood-in) device, reading nothing on the host; (result, grouped GEMM calls)."""
    a, b = operands(fmt)
    grouped: list = []
    record_calls(monkeypatch, grouped_dispatch, "experts_mm", grouped)
    monkeypatch.setattr(dispatch, "scaled_mm_native", lambda *a: pytest.fail("a dense GEMM per batch item"))
    bias_t = torch.randn(N) if bias else None
    with HostReads() as rec:
        got = scaled_mm(a, b, bias_t, out_dtype)
    assert rec.found == []
    assert got.shape == (B, M, N) and got.dtype == out_dtype
    close(got, dispatch.reference_scaled_mm(a, b, bias_t, torch.float32))
    return got, grouped


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
@pytest.mark.parametrize("bias,out_dtype", [(False, torch.float32), (True, torch.bfloat16)])
def test_sm90_batched_product_is_one_decoded_grouped_gemm(monkeypatch, fmt, bias, out_dtype):
    stand_in_gpu(monkeypatch, (9, 0))
    _, grouped = run_batched(monkeypatch, fmt, bias, out_dtype)
    assert [args[-1] for _, args in grouped] == ["decoded_grouped"]


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_sm100_batched_product_is_one_native_grouped_gemm(monkeypatch, fmt):
    stand_in_gpu(monkeypatch, (10, 0))
    monkeypatch.setattr(F, "scaled_grouped_mm", fake_scaled_grouped_mm)
    native_calls.clear()
    _, grouped = run_batched(monkeypatch, fmt, False, torch.bfloat16)
    assert [args[-1] for _, args in grouped] == ["native_grouped"] and len(native_calls) == 1


def test_forced_triton_batched_product_is_one_in_register_grouped_gemm(monkeypatch):
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    _, grouped = run_batched(monkeypatch, "nvfp4", True, torch.float32)
    assert [args[-1] for _, args in grouped] == ["triton_grouped"]


def test_batched_bf16_product_is_one_batched_matmul(monkeypatch):
    stand_in_gpu(monkeypatch, (9, 0))
    a, b = operands(None)
    dense: list = []
    record_calls(monkeypatch, dispatch, "scaled_mm", dense)
    bias = torch.randn(N)
    got = scaled_mm(a, b, bias, torch.bfloat16)
    assert dense == [], "no dense GEMM per batch item"
    assert torch.equal(got, dispatch.reference_scaled_mm(a, b, bias, torch.bfloat16))


def test_batched_bf16_beside_quantized_runs_per_item(monkeypatch):
    """No grouped GEMM multiplies a bf16 operand by a quantized one: one dense product per item."""
    stand_in_gpu(monkeypatch, (9, 0))
    (a, _), (_, b) = operands("nvfp4"), operands(None)
    dense: list = []
    record_calls(monkeypatch, dispatch, "scaled_mm", dense)
    got = scaled_mm(a, b, None, torch.float32)
    assert len(dense) == B
    close(got, dispatch.reference_scaled_mm(a, b, None, torch.float32))


def test_batched_operands_are_checked():
    a, b = operands("mxfp8")
    with pytest.raises(ValueError, match=r"batched shapes \(3, 40, 64\) @ \(3, 48, 64\)"):
        scaled_mm(a, dispatch.quantize(torch.randn(B, N, K), "mxfp8", 2))
    with pytest.raises(ValueError, match="operand b must be blocked along its reduction dim 1, got dim 2"):
        scaled_mm(a, dispatch.quantize(torch.randn(B, K, K), "mxfp8", 2))
    with pytest.raises(ValueError, match=r"bias must have shape \(48,\)"):
        scaled_mm(a, b, torch.zeros(K))
    with pytest.raises(TypeError, match="operand b must be a QuantizedTensor or bfloat16, got torch.float32"):
        scaled_mm(a, torch.randn(B, K, N))


def test_sm100_batch_of_1024_items_runs_the_one_launch_triton_gemm(monkeypatch):
    """torch's grouped GEMMs refuse 1024 groups or more: such a batch (32 sequences x 32 heads) runs the one-launch
    Triton GEMM (its equal groups found without offsets; numerics as above), saying why."""
    stand_in_gpu(monkeypatch, (10, 0))
    gen = torch.Generator().manual_seed(1)
    a = dispatch.quantize(torch.randn(1024, 1, 32, generator=gen), "mxfp8", 2)
    b = dispatch.quantize(torch.randn(1024, 32, 16, generator=gen), "mxfp8", 1)
    paths: list = []
    monkeypatch.setattr(grouped_dispatch, "experts_mm",
                        lambda qa, qb, offs, out_dtype, path: paths.append(path) or torch.zeros(1024, 16))
    assert scaled_mm(a, b, None, torch.bfloat16).shape == (1024, 1, 16) and paths == ["decoded_grouped"]
    ops = (Operand(a.fmt, None, None, None, 1, 32), Operand(b.fmt, None, None, None, 16, 32))
    assert "1024 groups (torch's grouped GEMMs take at most 1023)" in grouped_dispatch.grouped_gemm_path(
        (10, 0), "2d3d", *ops, torch.bfloat16, 1024)[1]


def test_sm90_compiled_eager_attention_runs_each_bmm_as_one_grouped_gemm(monkeypatch, fresh_dynamo):
    """End to end: a GPT with eager attention (scores and mix are bmm over batch x heads) compiled under the nvfp4
    recipe for a stood-in H100: every planned bmm of a step (2 forward, 4 backward) runs as one grouped GEMM, and
    the gradients equal the same step's on the CPU's reference kernels."""
    from gpt_model import TinyGPT, tokens

    idx, tgt = tokens(batch=2, ctx=32, vocab=64)

    def grads(seed_model: TinyGPT) -> list[torch.Tensor]:
        model = TinyGPT(vocab=64, d=64, layers=1, heads=2, ctx=32, sdpa=False).bfloat16()
        model.load_state_dict(seed_model.state_dict())
        compiled = torch.compile(model, backend="autoprec", options={"recipe": "nvfp4"})
        for _ in range(2):  # the second step runs the fixed plan
            model.zero_grad()
            compiled(idx, tgt).backward()
        return [p.grad for p in model.parameters()]

    torch.manual_seed(0)
    seed_model = TinyGPT(vocab=64, d=64, layers=1, heads=2, ctx=32, sdpa=False).bfloat16()
    paths = grouped_paths_on_stand_in_gpu(monkeypatch, (9, 0), lambda: grads(seed_model))
    assert paths == ["decoded_grouped"] * 6 * 2
