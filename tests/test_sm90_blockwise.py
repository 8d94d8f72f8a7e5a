"""The sm_90 FP8-block GEMM: the arguments ``scaled_mm_blockwise`` gives ``torch.nn.functional.scaled_mm``, checked
by torch's own meta checks of ``torch._scaled_mm_v2`` on fake CUDA tensors and by a stand-in that decodes them as
cuBLAS's blockwise scaling reads them; and which product ``dispatch.scaled_mm`` runs for FP8-block operands."""
import pytest
import torch
import torch.nn.functional as F
from test_sm100_native import on_fake_cuda
from torch._subclasses.fake_tensor import FakeTensorMode

from autoprec.kernels.core.operand import as_operand
from autoprec.kernels.cuda import scaled_mm_blockwise as blockwise
from autoprec.kernels.cuda.scaled_mm_blockwise import blockwise_problem, scaled_mm_blockwise
from autoprec.kernels.dispatch import dense as dispatch

CASES = {  # (a tiled, b tiled): the three pairs cuBLAS takes
    "1x128-128x128": (False, True),
    "1x128-1x128": (False, False),
    "128x128-1x128": (True, False),
}


def operands(case: str, m: int = 256, n: int = 384, k: int = 640):
    tile_a, tile_b = CASES[case]
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(m, k, generator=gen) * 4, torch.randn(k, n, generator=gen) * 0.02
    qa = dispatch.quantize(x, "fp8_block", 1, tile2d=tile_a)
    qb = dispatch.quantize(w, "fp8_block", 0, tile2d=tile_b)
    return qa, qb


def decode(mat: torch.Tensor, scale: torch.Tensor, recipe, rows: int, k: int) -> torch.Tensor:
    """float64 (rows, K) values of an FP8 operand given (rows, K) and its scales as torch documents them."""
    if recipe == F.ScalingType.BlockWise1x128:
        assert scale.shape == (rows, k // 128) and scale.stride(0) == 1, "1x128 scales: (rows, K/128), outer-dim-major"
        per = scale.double().repeat_interleave(128, 1)
    else:
        assert recipe == F.ScalingType.BlockWise128x128
        assert scale.shape[1] == rows // 128 and scale.shape[0] % 4 == 0 and scale.stride(0) == 1
        per = scale.t()[:, : k // 128].double().repeat_interleave(128, 0).repeat_interleave(128, 1)
    return mat.double() * per


def fake_scaled_mm(mat_a, mat_b, scale_a, recipe_a, scale_b, recipe_b, swizzle_a=None, swizzle_b=None, bias=None,
                   output_dtype=torch.bfloat16, contraction_dim=(), use_fast_accum=False):
    """cuBLAS's blockwise-scaled FP8 GEMM as torch documents it, decoded in float64."""
    assert mat_a.dtype == mat_b.dtype == torch.float8_e4m3fn and mat_b.stride(0) == 1, "B must be column-major"
    assert scale_a.dtype == scale_b.dtype == torch.float32 and bias is None and output_dtype == torch.float32
    assert not recipe_a == recipe_b == F.ScalingType.BlockWise128x128
    (m, k), n = mat_a.shape, mat_b.shape[1]
    a = decode(mat_a, scale_a, recipe_a, m, k)
    b = decode(mat_b.t(), scale_b, recipe_b, n, k)
    return (a @ b.t()).float()


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_blockwise_arguments_describe_the_reference_product(monkeypatch, case, out_dtype):
    """K of 5 blocks (its tile scales padded to 8), a bias: the product the arguments describe is the reference's
    up to fp32 accumulation order."""
    qa, qb = operands(case)
    bias = torch.randn(384)
    monkeypatch.setattr(F, "scaled_mm", fake_scaled_mm)
    got = scaled_mm_blockwise(as_operand(qa, 1, "a"), as_operand(qb, 0, "b"), bias, out_dtype)
    want = dispatch.scaled_mm(qa, qb, bias, torch.float32)
    assert got.dtype == out_dtype and got.shape == (256, 384)
    torch.testing.assert_close(got.float(), want.to(out_dtype).float(), rtol=1e-2 if out_dtype == torch.bfloat16
                               else 1e-5, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("case", list(CASES))
def test_blockwise_arguments_pass_torch_meta_checks(monkeypatch, case):
    """torch's checks of ``torch._scaled_mm_v2`` (fp8 dtypes, A row-major and B column-major on a CUDA device, the
    recipe pair, fp32 scale shapes and outer-dim-major strides, the padded tile count) pass the arguments built
    from CUDA operands; row-major scales do not, so the checks bite."""
    qa, qb = operands(case)
    a, b = as_operand(qa, 1, "a"), as_operand(qb, 0, "b")
    mode = FakeTensorMode()
    with mode:
        out = scaled_mm_blockwise(on_fake_cuda(mode, a), on_fake_cuda(mode, b), None, torch.bfloat16)
    assert out.shape == (256, 384) and out.dtype == torch.bfloat16 and out.device.type == "cuda"

    def row_major(op):
        return op.scales.view(torch.float32), (F.ScalingType.BlockWise128x128 if op.tile_rows > 1
                                               else F.ScalingType.BlockWise1x128)

    monkeypatch.setattr(blockwise, "_scales", row_major)
    with mode, pytest.raises(RuntimeError, match="blockwise scaling"):
        scaled_mm_blockwise(on_fake_cuda(mode, a), on_fake_cuda(mode, b), None, torch.bfloat16)


def test_blockwise_problems_are_named(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.9")
    qa, qb = operands("1x128-128x128")
    a, b = as_operand(qa, 1, "a"), as_operand(qb, 0, "b")
    assert blockwise_problem((9, 0), a, b) is None
    assert "sm_90 only" in blockwise_problem((10, 0), a, b) and "sm_90 only" in blockwise_problem(None, a, b)
    tiled_a = as_operand(operands("128x128-1x128")[0], 1, "a")
    assert "two 128x128-tiled" in blockwise_problem((9, 0), tiled_a, b)
    mx = as_operand(dispatch.quantize(torch.randn(256, 640), "mxfp8", 1), 1, "a")
    assert "mxfp8 times fp8_block" in blockwise_problem((9, 0), mx, b)
    narrow = as_operand(dispatch.quantize(torch.randn(640, 40), "fp8_block", 0), 0, "b")
    assert "N=40" in blockwise_problem((9, 0), a, narrow)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert "CUDA 12.8" in blockwise_problem((9, 0), a, b)


def test_dispatch_runs_blockwise_on_sm90_and_the_reference_elsewhere(monkeypatch):
    """On sm_90 (a stand-in device) the FP8-block product is cuBLAS's blockwise GEMM; without it (this CPU, or
    operands it does not take) the bit-exact reference; a forced Triton run says why it cannot."""
    qa, qb = operands("1x128-128x128")
    calls = []
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(torch.version, "cuda", "12.9")
    monkeypatch.setattr(dispatch, "scaled_mm_blockwise", lambda a, b, bias, out: calls.append((a, b)) or "cublas")
    assert dispatch.scaled_mm(qa, qb) == "cublas" and calls[0][1].tile_rows == 128
    monkeypatch.setattr(dispatch, "device_capability", lambda device: None)
    assert torch.equal(dispatch.scaled_mm(qa, qb), dispatch.reference_scaled_mm(qa, qb, None, torch.float32))
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    with pytest.raises(ValueError, match="fp8_block operands run cuBLAS's blockwise GEMM"):
        dispatch.scaled_mm(qa, qb)
