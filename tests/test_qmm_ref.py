"""Emulated quantized matmul: SQNR floors per format on N(0, 1) data (measured dB in each case id)."""
import pytest
import torch

from autoprec.kernels import fake_quantize_ref, qmm_ref

from helpers import bits_equal, sqnr_db

# (fmt_a, fmt_b, options, floor dB); the id carries the value measured on this data (seed 0)
CASES = [
    ("nvfp4", "nvfp4", {}, 16.5, "17.3dB"),
    ("nvfp4", "nvfp4", {"tile2d_b": True}, 15.8, "16.5dB"),
    ("nvfp4", "nvfp4", {"rht": True}, 16.5, "17.4dB"),
    ("nvfp4", "nvfp4", {"rounding_a": "sr", "rounding_b": "sr"}, 13.3, "14.1dB"),
    ("mxfp8", "mxfp8", {}, 27.8, "28.6dB"),
    ("mxfp8", "mxfp8", {"scale_mode": "floor"}, 26.9, "27.7dB"),
    ("mxfp8", "mxfp8", {"rounding_a": "sr", "rounding_b": "sr"}, 24.6, "25.5dB"),
    ("mxfp8_e5m2", "mxfp8_e5m2", {}, 21.6, "22.4dB"),
    ("mxfp8", "mxfp8_e5m2", {}, 23.7, "24.5dB"),
    ("nvfp4", "bf16", {}, 19.6, "20.4dB"),
    ("bf16", "bf16", {}, 51.5, "52.5dB"),
]


@pytest.fixture(scope="module")
def operands():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(128, 256, generator=gen), torch.randn(256, 64, generator=gen)


@pytest.mark.parametrize("fa,fb,opts,floor", [c[:4] for c in CASES], ids=[f"{c[0]}x{c[1]}-{c[4]}" for c in CASES])
def test_sqnr_floor(operands, fa, fb, opts, floor):
    a, b = operands
    got = sqnr_db(a.double() @ b.double(), qmm_ref(a, b, fa, fb, **opts))
    assert got > floor


def test_equals_product_of_fake_quantized_operands(operands):
    a, b = operands
    want = fake_quantize_ref(a, "nvfp4", -1) @ fake_quantize_ref(b, "mxfp8", 0)
    assert bits_equal(qmm_ref(a, b, "nvfp4", "mxfp8"), want)


def test_batched_and_out_dtype():
    a, b = torch.randn(3, 8, 64), torch.randn(3, 64, 16)
    y = qmm_ref(a, b, "mxfp8", "mxfp8", out_dtype=torch.bfloat16)
    assert y.shape == (3, 8, 16) and y.dtype == torch.bfloat16
    assert bits_equal(y[1], qmm_ref(a[1], b[1], "mxfp8", "mxfp8", out_dtype=torch.bfloat16))


def test_sr_seeds_reproducible(operands):
    a, b = operands
    y1 = qmm_ref(a, b, "nvfp4", "nvfp4", rounding_a="sr", rounding_b="sr", seed=5)
    y2 = qmm_ref(a, b, "nvfp4", "nvfp4", rounding_a="sr", rounding_b="sr", seed=5)
    assert bits_equal(y1, y2)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match=r"qmm: shapes \(4, 32\) @ \(16, 8\)"):
        qmm_ref(torch.randn(4, 32), torch.randn(16, 8), "nvfp4", "nvfp4")
    with pytest.raises(ValueError, match=r"shape \(4, 40\).*block size 32"):
        qmm_ref(torch.randn(4, 40), torch.randn(40, 8), "mxfp8", "bf16")


def test_nan_propagates():
    a = torch.randn(4, 32)
    a[2, 5] = float("nan")
    y = qmm_ref(a, torch.randn(32, 8), "nvfp4", "nvfp4")
    assert torch.isnan(y[2]).all() and torch.isfinite(y[[0, 1, 3]]).all()
