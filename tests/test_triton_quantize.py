"""Triton quantizers equal the reference byte for byte (interpreter on CPU, small shapes)."""
import pytest
import torch

from helpers import bits_equal, edge_tensor

pytest.importorskip("triton")

from autoprec.formats import get_format
from autoprec.kernels import quantize_ref, rht_ref, rht_signs
from autoprec.kernels.quantize_triton import quantize_triton
from autoprec.kernels.random_bits import sr_bits

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def assert_same(q, r):
    assert q.codes.dtype == r.codes.dtype and q.scales.dtype == r.scales.dtype
    assert bits_equal(q.codes.cpu(), r.codes) and bits_equal(q.scales.cpu(), r.scales)
    if r.tensor_scale is not None:
        assert bits_equal(q.tensor_scale.cpu(), r.tensor_scale)
    assert (q.axis, q.shape, q.tile_rows) == (r.axis, r.shape, r.tile_rows)


def check(x, fmt, axis, sr, rht, **opts):
    rand = sr_bits(x.shape, 11) if sr else None
    src = rht_ref(x, axis) if rht else x
    ref = quantize_ref(src, fmt, axis, rounding="sr" if sr else "rne", rand=rand, **opts)
    got = quantize_triton(x.to(DEVICE), get_format(fmt), axis, rht=rht,
                          rand=None if rand is None else rand.to(DEVICE), **opts)
    assert_same(got, ref)


@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
@pytest.mark.parametrize("sr", [False, True], ids=["rne", "sr"])
@pytest.mark.parametrize("axis", [1, 0], ids=["rows", "cols"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8", "mxfp8_e5m2"])
def test_quantize_matches_reference(fmt, axis, sr, rht):
    check(edge_tensor(64, 96), fmt, axis, sr, rht)


@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("sr", [False, True], ids=["rne", "sr"])
def test_nvfp4_16x16_tiles(axis, sr):
    check(edge_tensor(48, 64), "nvfp4", axis, sr, False, tile2d=True)


def test_mxfp8_floor_scales():
    check(edge_tensor(32, 64) * 100, "mxfp8", 1, False, False, scale_mode="floor")


@pytest.mark.parametrize("axis", [0, 1])
def test_column_major_input(axis):
    x = edge_tensor(64, 64).t()  # a strided view: the kernel reads it through its strides
    check(x, "mxfp8", axis, False, False)
    check(x, "nvfp4", axis, True, False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs(dtype):
    x = torch.randn(16, 64).to(dtype)
    check(x, "nvfp4", 1, False, False)


def test_3d_input_and_partial_tiles():
    x = torch.randn(3, 5, 48)  # 15 rows, K=48: neither is a multiple of the kernel tile
    check(x, "nvfp4", 2, True, True)
    check(torch.randn(2, 64, 7), "mxfp8", 1, False, False)


def test_all_zero_and_all_nan_tensors():
    check(torch.zeros(16, 32), "nvfp4", 1, False, False)
    check(torch.full((16, 32), float("nan")), "nvfp4", 1, False, False)
    check(torch.zeros(16, 32), "mxfp8", 1, False, False)


def test_custom_rht_signs():
    x = torch.randn(16, 64)
    signs = rht_signs(123)
    ref = quantize_ref(rht_ref(x, 1, signs), "nvfp4", 1)
    assert_same(quantize_triton(x.to(DEVICE), get_format("nvfp4"), 1, rht=True, rht_signs_=signs), ref)
