"""The sm_100 native path: the arguments ``scaled_mm_native`` gives ``torch.nn.functional.scaled_mm``, checked
against torch's contract for cuBLAS's block-scaled GEMM (dtypes, B column-major, swizzled scale sizes,
recipes, fp32 output without bias) by a stand-in that decodes them, and by torch's own meta checks on fake CUDA
tensors; and which path ``gemm_path`` picks."""
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from autoprec.kernels.core.operand import Operand, as_operand
from autoprec.kernels.cuda import scaled_mm as native
from autoprec.kernels.cuda.scaled_mm import native_problem, scaled_mm_native
from autoprec.kernels.dispatch import dense as dispatch

from helpers import decode_swizzled


def fake_scaled_mm(mat_a, mat_b, scale_a, recipe_a, scale_b, recipe_b, swizzle_a=None, swizzle_b=None, bias=None,
                   output_dtype=torch.bfloat16, contraction_dim=(), use_fast_accum=False):
    """cuBLAS's block-scaled GEMM as torch documents it, decoded in float64."""
    assert mat_b.stride(0) == 1, "B must be column-major"
    assert bias is None and output_dtype == torch.float32
    nvfp4 = mat_a.dtype == torch.float4_e2m1fn_x2
    k = mat_a.shape[1] * (2 if nvfp4 else 1)
    assert k % 16 == 0 and mat_b.shape[1] % 16 == 0 and mat_a.shape[1] == mat_b.shape[0]
    alpha = torch.ones((), dtype=torch.float32)
    if nvfp4:
        assert recipe_a == recipe_b == [F.ScalingType.BlockWise1x16, F.ScalingType.TensorWise]
        assert swizzle_a == swizzle_b == [F.SwizzleType.SWIZZLE_32_4_4, F.SwizzleType.NO_SWIZZLE]
        assert scale_a[0].dtype == scale_b[0].dtype == torch.float8_e4m3fn
        assert scale_a[1].dtype == scale_b[1].dtype == torch.float32 and scale_a[1].numel() == 1
        alpha = scale_a[1].reshape(()) * scale_b[1].reshape(())
        scale_a, scale_b, block = scale_a[0], scale_b[0], 16
    else:
        assert recipe_a == recipe_b == F.ScalingType.BlockWise1x32
        assert swizzle_a == swizzle_b == F.SwizzleType.SWIZZLE_32_4_4
        assert scale_a.dtype == scale_b.dtype == torch.float8_e8m0fnu
        assert not mat_a.dtype == mat_b.dtype == torch.float8_e5m2
        block = 32
    a, b = decode_swizzled(mat_a, scale_a, block), decode_swizzled(mat_b.t(), scale_b, block)
    return ((a @ b.t()) * alpha.double()).float()


CASES = {  # (format of a, format of b, 16x16 weight tiles)
    "nvfp4": ("nvfp4", "nvfp4", False),
    "nvfp4-16x16-weight": ("nvfp4", "nvfp4", True),
    "mxfp8": ("mxfp8", "mxfp8", False),
    "mxfp8-e4m3-e5m2": ("mxfp8", "mxfp8_e5m2", False),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_sm100_native_arguments_follow_torch_contract_and_match_the_reference(monkeypatch, case, out_dtype):
    """Odd M (swizzle padding), several scale tiles along K, bias: the product the arguments describe is
    the reference's up to fp32 accumulation order."""
    fa, fb, tiles = CASES[case]
    gen = torch.Generator().manual_seed(7)
    x, w = torch.randn(72, 160, generator=gen) * 3, torch.randn(48, 160, generator=gen) * 0.02
    a = dispatch.quantize(x, fa, 1)
    b = dispatch.quantize(w.t(), fb, 0, tile2d=tiles)
    bias = torch.randn(48, generator=gen)
    monkeypatch.setattr(F, "scaled_mm", fake_scaled_mm)
    got = scaled_mm_native(as_operand(a, 1, "a"), as_operand(b, 0, "b"), bias, out_dtype)
    want = dispatch.scaled_mm(a, b, bias, torch.float32)
    assert got.dtype == out_dtype and got.shape == (72, 48)
    torch.testing.assert_close(got.float(), want.to(out_dtype).float(), rtol=1e-2 if out_dtype == torch.bfloat16
                               else 1e-5, atol=1e-5 * float(want.abs().max()))


def fake_cuda(mode: FakeTensorMode, t: torch.Tensor | None) -> torch.Tensor | None:
    """A fake tensor on a CUDA device with ``t``'s sizes, strides and dtype (no data, no GPU needed)."""
    if t is None:
        return None
    meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    return FakeTensor(mode, meta, torch.device("cuda", 0))


def on_fake_cuda(mode: FakeTensorMode, op: Operand) -> Operand:
    """``op`` with its tensors as ``fake_cuda`` tensors."""
    return replace(op, codes=fake_cuda(mode, op.codes), scales=fake_cuda(mode, op.scales),
                   tensor_scale=fake_cuda(mode, op.tensor_scale))


@pytest.mark.parametrize("case", list(CASES))
def test_sm100_native_arguments_pass_torch_meta_checks(monkeypatch, case):
    """torch's own checks of ``torch._scaled_mm_v2`` (its meta function, which the fake tensors run: fp8 / fp4
    dtypes, A row-major and B column-major on a CUDA device, sizes divisible by 16, the recipes, scale dtypes and
    swizzled scale counts) pass the arguments ``scaled_mm_native`` builds from CUDA operands; scales left
    unswizzled do not, so the checks bite."""
    fa, fb, tiles = CASES[case]
    a = as_operand(dispatch.quantize(torch.randn(72, 160), fa, 1), 1, "a")  # M, K padded to 128 x 4 scale tiles
    b = as_operand(dispatch.quantize(torch.randn(160, 48), fb, 0, tile2d=tiles), 0, "b")
    mode = FakeTensorMode()
    with mode:
        bias = fake_cuda(mode, torch.empty(48))
        out = scaled_mm_native(on_fake_cuda(mode, a), on_fake_cuda(mode, b), bias, torch.bfloat16)
    assert out.shape == (72, 48) and out.dtype == torch.bfloat16 and out.device.type == "cuda"
    monkeypatch.setattr(native, "swizzle_scales", lambda scales: scales.flatten())
    with mode, pytest.raises(RuntimeError, match="scale_a must have"):
        scaled_mm_native(on_fake_cuda(mode, a), on_fake_cuda(mode, b), None, torch.bfloat16)


def operands(fa: str, fb: str, n: int = 48, k: int = 64):
    a = as_operand(dispatch.quantize(torch.randn(32, k), fa, 1), 1, "a")
    b = as_operand(dispatch.quantize(torch.randn(k, n), fb, 0), 0, "b")
    return a, b


@pytest.mark.parametrize("fa,fb,n,k,why", [
    ("nvfp4", "mxfp8", 48, 64, "nvfp4 times mxfp8"),
    ("mxfp8_e5m2", "mxfp8_e5m2", 48, 64, "two E5M2 operands"),
    ("nvfp4", "nvfp4", 40, 64, "N=40 is not a multiple of 16"),
    ("nvfp4", "nvfp4", 48, 48, "K=48 is not a multiple of 32"),
])
def test_sm100_native_problems_are_named(fa, fb, n, k, why):
    assert why in native_problem(*operands(fa, fb, n, k))
    bf16 = as_operand(torch.randn(32, 64).bfloat16(), 1, "a")
    assert "BF16 operand" in native_problem(bf16, operands("nvfp4", "nvfp4")[1])


def test_gemm_path_by_capability(monkeypatch):
    """sm_100 -> native; sm_90, or an operand pair the native GEMM does not take -> decoded to bf16 for
    cuBLAS; the interpreter, or a forced Triton run -> Triton on tensor cores."""
    a, b = operands("nvfp4", "nvfp4")
    assert dispatch.gemm_path((10, 0), a, b) == ("native", None)
    assert dispatch.gemm_path((9, 0), a, b) == ("decoded", None)
    assert dispatch.gemm_path(None, a, b) == ("tensor_core", "the Triton interpreter")
    path, why = dispatch.gemm_path((10, 0), *operands("nvfp4", "nvfp4", n=40))
    assert path == "decoded" and "N=40" in why
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    assert dispatch.gemm_path((10, 0), a, b) == ("tensor_core", "AUTOPREC_KERNELS=triton")
    assert dispatch.gemm_path((9, 0), a, b) == ("tensor_core", "AUTOPREC_KERNELS=triton")
