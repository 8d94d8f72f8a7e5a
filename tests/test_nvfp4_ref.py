"""NVFP4 reference quantizer: the scale chain on hand-computed blocks, edge blocks, round trips, 2D tiles."""
import numpy as np
import pytest
import torch

from autoprec.formats import NVFP4
from autoprec.kernels import dequantize_ref, quantize_ref
from autoprec.kernels.reference.rounding import unpack_nibbles

from helpers import bits_equal

F32 = np.float32


def scale_bytes(q) -> list[float]:
    return q.scales.to(torch.float32).flatten().tolist()


def test_amax_six_maps_exactly():
    x = torch.zeros(2, 16)
    x[0, :8] = torch.tensor([6.0, -6.0, 3.0, 1.5, 0.5, -0.5, 4.0, 2.0])
    x[1, :4] = torch.tensor([3.0, -1.5, 0.75, 0.0])  # scaled by 6/3: 6, -3, 1.5, 0
    q = quantize_ref(x, "nvfp4")
    s_enc = F32(2688.0) / F32(6.0)  # 448
    assert q.tensor_scale.item() == F32(1.0) / s_enc
    # block 0: amax 6 -> e4m3(6 · (448 · 1/6)) = 448; block 1: amax 3 -> 224
    assert scale_bytes(q) == [448.0, 224.0]
    codes = unpack_nibbles(q.codes)
    assert codes[0, :8].tolist() == [0x7, 0xF, 0x5, 0x3, 0x1, 0x9, 0x6, 0x4]
    assert codes[1, :4].tolist() == [0x7, 0xD, 0x3, 0x0]
    deq = dequantize_ref(q)
    assert torch.allclose(deq, x, rtol=1e-6, atol=0)


def test_scale_chain_matches_the_formula_in_fp32():
    x = torch.tensor([[0.1, -0.37, 2.9, 1e-3] * 4, [5.5, 0.02, -0.6, 0.0] * 4])
    q = quantize_ref(x, "nvfp4")
    amax_t = F32(5.5)
    s_enc = F32(F32(448.0 * 6.0) / amax_t)
    s_dec = F32(1.0) / s_enc
    for row, amax_b in enumerate([F32(2.9), F32(5.5)]):
        s_b = F32(np.clip(amax_b * F32(s_enc * F32(1.0 / 6.0)), 0, 448)).astype(np.float32)
        s_b = float(torch.tensor(s_b).to(torch.float8_e4m3fn).float())
        assert scale_bytes(q)[row] == s_b
        e_b = F32(F32(1.0) / F32(F32(s_b) * s_dec))
        scaled = torch.tensor(x[row].numpy() * e_b)
        grid = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
        nearest = [min(grid, key=lambda g: (abs(abs(v) - g), grid.index(g) % 2)) for v in scaled.tolist()]
        expect = torch.tensor(nearest, dtype=torch.float32)
        got = dequantize_ref(q)[row].abs() / (F32(s_b) * s_dec)
        assert torch.allclose(got, expect, rtol=1e-6)
    assert q.tensor_scale.item() == s_dec


def test_zero_block_and_zero_tensor():
    x = torch.zeros(1, 32)
    x[0, 16:] = torch.linspace(-1, 1, 16)
    q = quantize_ref(x, "nvfp4")
    assert scale_bytes(q)[0] == 0.0 and unpack_nibbles(q.codes)[0, :16].eq(0).all()
    assert dequantize_ref(q)[0, :16].eq(0).all()
    qz = quantize_ref(torch.zeros(4, 16), "nvfp4")
    assert qz.tensor_scale.item() == 1.0 and qz.scales.float().eq(0).all() and qz.codes.eq(0).all()
    assert dequantize_ref(qz).eq(0).all()


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_block_dequantizes_to_nan(bad):
    x = torch.randn(2, 32)
    x[1, 20] = bad
    deq = dequantize_ref(quantize_ref(x, "nvfp4"))
    assert torch.isnan(deq[1, 16:]).all()
    assert torch.isfinite(deq[0]).all() and torch.isfinite(deq[1, :16]).all()


def test_saturating_and_subnormal_scales():
    x = torch.zeros(3, 16)
    x[0, 0] = 1e4
    x[1, 0] = 1e4 * 2.0**-16  # block scale lands in the E4M3 subnormal range
    x[2, 0] = 1e-30  # far below: scale rounds to 0, codes 0
    q = quantize_ref(x, "nvfp4")
    s = scale_bytes(q)
    assert s[0] == 448.0 and 0 < s[1] < 2.0**-6 and s[2] == 0.0
    assert dequantize_ref(q)[2].eq(0).all()


def test_codes_are_packed_and_small():
    x = torch.randn(64, 128)
    q = quantize_ref(x, "nvfp4")
    assert q.codes.dtype == torch.uint8 and q.codes.shape == (64, 64)
    assert q.scales.dtype == torch.float8_e4m3fn and q.scales.shape == (64, 8)
    assert q.nbytes == 64 * 64 + 64 * 8 + 4


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("tile2d", [False, True])
def test_round_trip_is_byte_stable(axis, tile2d):
    """Requantizing dequantized values reproduces the codes and scales (every block's max code is 6)."""
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(3))
    q = quantize_ref(x, "nvfp4", axis, tile2d=tile2d)
    q2 = quantize_ref(dequantize_ref(q), "nvfp4", axis, tile2d=tile2d)
    assert bits_equal(q.codes, q2.codes) and bits_equal(q.scales, q2.scales)
    assert bits_equal(q.tensor_scale, q2.tensor_scale)


def test_2d_tiles_give_identical_w_and_wt():
    w = torch.randn(48, 64, generator=torch.Generator().manual_seed(4))
    q_rows = quantize_ref(w, "nvfp4", 1, tile2d=True)  # fprop: W blocked along K
    q_cols = quantize_ref(w, "nvfp4", 0, tile2d=True)  # dgrad: W blocked along N
    q_t = quantize_ref(w.t(), "nvfp4", 0, tile2d=True)  # the transposed copy
    assert bits_equal(dequantize_ref(q_rows), dequantize_ref(q_cols))
    assert bits_equal(dequantize_ref(q_t), dequantize_ref(q_rows).t())
    assert bits_equal(q_rows.codes, q_t.codes) and q_rows.scales.shape == (3, 4)


def test_3d_input_along_middle_axis():
    x = torch.randn(2, 32, 5)
    deq = dequantize_ref(quantize_ref(x, "nvfp4", axis=1))
    assert deq.shape == x.shape
    assert bits_equal(deq, dequantize_ref(quantize_ref(x.movedim(1, -1), "nvfp4")).movedim(-1, 1))


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match=r"shape \(4, 30\).*block size 16"):
        quantize_ref(torch.randn(4, 30), "nvfp4")
    with pytest.raises(ValueError, match="16x16 tiles need both dims"):
        quantize_ref(torch.randn(8, 32), "nvfp4", tile2d=True)
    with pytest.raises(ValueError, match="16x16 tiles need a 2D tensor"):
        quantize_ref(torch.randn(2, 16, 32), "nvfp4", tile2d=True)
    with pytest.raises(ValueError, match="tile2d.*mxfp8"):
        quantize_ref(torch.randn(32, 32), "mxfp8", tile2d=True)
    with pytest.raises(ValueError, match="unknown rounding 'stochastic'"):
        quantize_ref(torch.randn(16, 16), NVFP4, rounding="stochastic")
    with pytest.raises(TypeError, match="floating-point"):
        quantize_ref(torch.ones(16, 16, dtype=torch.int32), "nvfp4")
