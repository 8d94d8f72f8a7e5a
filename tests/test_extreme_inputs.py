"""Kernels on extreme inputs: non-finite values among small ones, empty tensors."""
import pytest
import torch

from autoprec.kernels import dequantize_ref, qmm_ref, quantize_ref
from autoprec.kernels.dispatch import dense as dispatch

from helpers import bits_equal

FORMATS = ["nvfp4", "mxfp8", "mxfp8_e5m2"]
NORMAL_ERR = {"nvfp4": 0.02, "mxfp8": 0.002, "mxfp8_e5m2": 0.01}  # relative squared error on N(0,1) data


def rel_err(ref: torch.Tensor, approx: torch.Tensor) -> float:
    return float((approx - ref).pow(2).sum() / ref.pow(2).sum())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("fmt", FORMATS)
def test_one_non_finite_value_spares_the_other_rows(fmt, bad):
    """The NVFP4 tensor amax ignores NaN/Inf: the finite rows keep their usual error, and only the
    block holding the bad value dequantizes to NaN."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 128, generator=g) * 1e-3
    clean = dequantize_ref(quantize_ref(x, fmt))
    x[5, 40] = bad
    deq = dequantize_ref(quantize_ref(x, fmt))
    block = 16 if fmt == "nvfp4" else 32
    start = 40 // block * block
    assert torch.isnan(deq[5, start:start + block]).all()
    finite_rows = torch.ones(64, dtype=torch.bool)
    finite_rows[5] = False
    assert bits_equal(deq[finite_rows], clean[finite_rows])
    assert rel_err(x[finite_rows], deq[finite_rows]) < NORMAL_ERR[fmt]


def test_nvfp4_tensor_scale_from_finite_values_only():
    x = torch.full((2, 16), 1e-3)
    x[0, 0] = float("inf")
    q = quantize_ref(x, "nvfp4")
    finite = quantize_ref(torch.full((2, 16), 1e-3), "nvfp4")
    assert bits_equal(q.tensor_scale, finite.tensor_scale)
    all_bad = quantize_ref(torch.full((1, 16), float("nan")), "nvfp4")
    assert all_bad.tensor_scale.item() == 1.0 and torch.isnan(dequantize_ref(all_bad)).all()


@pytest.mark.parametrize("tile2d", [False, True])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("axis", [0, 1])
def test_empty_in_empty_out(fmt, axis, tile2d):
    if tile2d and fmt != "nvfp4":
        pytest.skip("16x16 tiles are an NVFP4 option")
    shape = (0, 64) if axis == 1 else (64, 0)
    x = torch.empty(shape)
    for rounding in ("rne", "sr"):
        q = quantize_ref(x, fmt, axis, rounding=rounding, tile2d=tile2d)
        assert dequantize_ref(q).shape == shape
        d = dispatch.quantize(x, fmt, axis, rounding=rounding, tile2d=tile2d, rht=not tile2d)
        assert dispatch.dequantize(d).shape == shape


@pytest.mark.parametrize("fmt", FORMATS + ["bf16"])
def test_empty_gemms(fmt):
    """No tokens: fprop gives (0, N), wgrad (reduction over zero tokens) gives zeros."""
    w = torch.randn(64, 32)
    assert qmm_ref(torch.empty(0, 64), w, fmt, fmt).shape == (0, 32)
    if fmt == "bf16":
        return
    qa = dispatch.quantize(torch.empty(0, 64), fmt, 1)
    qb = dispatch.quantize(w, fmt, 0)
    assert dispatch.scaled_mm(qa, qb).shape == (0, 32)
