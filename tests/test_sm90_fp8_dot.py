"""The MXFP8 FP8-dot matmul (sm_90 wgmma e4m3/e5m2) in the interpreter against the reference qmm, and where
dispatch uses it: MXFP8 pairs whose scales leave bf16's exact range. (PTX: test_sm90_tensor_core_gemm.py.)"""
import pytest
import torch

pytest.importorskip("triton")

from autoprec.kernels import dispatch, qmm_ref, quantize_ref
from autoprec.kernels.operand import as_operand
from autoprec.kernels.scaled_mm_fp8_triton import fp8_dot_problem, scaled_mm_fp8_triton


@pytest.mark.parametrize("fa,fb", [("mxfp8", "mxfp8"), ("mxfp8", "mxfp8_e5m2"), ("mxfp8_e5m2", "mxfp8")])
@pytest.mark.parametrize("scale", [1.0, 2.0**-125])  # the second: scale exponents below bf16's normal range
def test_sm90_fp8_dot_matches_reference_qmm(fa, fb, scale):
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(40, 96, generator=gen) * scale, torch.randn(96, 48, generator=gen)  # M, N not tile multiples
    want = qmm_ref(a, b, fa, fb)
    got = scaled_mm_fp8_triton(as_operand(quantize_ref(a, fa, 1), 1, "a"), as_operand(quantize_ref(b, fb, 0), 0, "b"),
                               None, torch.float32)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_sm90_fp8_dot_bias_bf16_output_and_nan_blocks():
    a, b, bias = torch.randn(32, 64), torch.randn(64, 32), torch.randn(32)
    a[3, 5] = float("nan")  # the block's scale is NaN: its row of the product is NaN, as in the reference
    qa, qb = quantize_ref(a, "mxfp8", 1), quantize_ref(b, "mxfp8", 0)
    want = dispatch.scaled_mm(qa, qb, bias)
    got = scaled_mm_fp8_triton(as_operand(qa, 1, "a"), as_operand(qb, 0, "b"), bias, torch.bfloat16)
    assert torch.equal(got.isnan(), want.isnan()) and bool(got[3].isnan().all())
    ok = ~want.isnan()
    assert torch.allclose(got.float()[ok], want[ok], rtol=2**-8, atol=1e-3)


def test_sm90_gemm_path_takes_the_fp8_dot_where_bf16_is_not_exact():
    tiny = as_operand(quantize_ref(torch.randn(8, 64) * 2.0**-125, "mxfp8", 1), 1, "a")
    b = as_operand(quantize_ref(torch.randn(64, 16), "mxfp8", 0), 0, "b")
    path, why = dispatch.gemm_path((9, 0), tiny, b)
    assert path == "fp8_dot" and "bf16's exact range" in why
    nv = as_operand(quantize_ref(torch.randn(64, 16), "nvfp4", 0), 0, "b")
    path, why = dispatch.gemm_path((9, 0), tiny, nv)
    assert path == "fp32" and "FP8 dot multiplies two MXFP8 operands" in why
    e5m2 = [as_operand(quantize_ref(torch.randn(64, 64), "mxfp8_e5m2", k), k, "x") for k in (1, 0)]
    assert "two E5M2" in fp8_dot_problem(*e5m2)
