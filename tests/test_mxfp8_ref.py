"""MXFP8 reference quantizer: E8M0 scale rules, element casts, edge blocks and round trips."""
import pytest
import torch

from autoprec.kernels import dequantize_ref, quantize_ref

from helpers import bits_equal


def test_rceil_scale_and_elements_by_hand():
    x = torch.zeros(3, 32)
    x[0, 0], x[0, 1] = 448.0, 1.0  # amax/448 = 1 -> e = 0
    x[1, 0], x[1, 1] = 449.0, 3.3  # amax/448 just above 1 -> e = 1, elements halved
    x[2, 0] = 1.0  # amax/448 = 2**-8.8 -> e = -8, element 256
    q = quantize_ref(x, "mxfp8")
    assert (q.scales.to(torch.int32) - 127).flatten().tolist() == [0, 1, -8]
    assert q.codes.float()[:, 0].tolist() == [448.0, 224.0, 256.0]
    assert q.codes.float()[1, 1].item() == 1.625  # 3.3 / 2 = 1.65 -> nearest E4M3 1.625
    assert dequantize_ref(q)[0, :2].tolist() == [448.0, 1.0]


def test_floor_scale_saturates_elements():
    x = torch.zeros(2, 32)
    x[0, 0] = 500.0  # floor(log2 500) - 8 = 0: element 500 saturates to 448
    x[1, 0] = 1.0  # e = -8 -> element 256
    q = quantize_ref(x, "mxfp8", scale_mode="floor")
    assert (q.scales.to(torch.int32) - 127).flatten().tolist() == [0, -8]
    assert q.codes.float()[:, 0].tolist() == [448.0, 256.0]


def test_e5m2_elements():
    x = torch.zeros(1, 32)
    x[0, :3] = torch.tensor([57344.0, 1.2, -3e-5])
    q = quantize_ref(x, "mxfp8_e5m2")
    assert q.codes.dtype == torch.float8_e5m2 and q.scales.item() == 127
    assert dequantize_ref(q)[0, :2].tolist() == [57344.0, 1.25]


def test_zero_block_takes_smallest_scale():
    q = quantize_ref(torch.zeros(2, 64), "mxfp8")
    assert q.scales.eq(0).all() and dequantize_ref(q).eq(0).all()


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp8_e5m2"])
def test_non_finite_block_dequantizes_to_nan(bad, fmt):
    x = torch.randn(2, 64)
    x[0, 40] = bad
    q = quantize_ref(x, fmt)
    assert q.scales[0, 1].item() == 255
    deq = dequantize_ref(q)
    assert torch.isnan(deq[0, 32:]).all() and torch.isfinite(deq[0, :32]).all() and torch.isfinite(deq[1]).all()


def test_floor_round_trip_is_byte_stable():
    x = torch.randn(32, 128, generator=torch.Generator().manual_seed(5)) * 100
    q = quantize_ref(x, "mxfp8", 0, scale_mode="floor")
    q2 = quantize_ref(dequantize_ref(q), "mxfp8", 0, scale_mode="floor")
    assert bits_equal(q.codes, q2.codes) and bits_equal(q.scales, q2.scales)


def test_rceil_round_trip():
    """RCEIL is byte-stable except blocks whose max element rounded down to 224 (=448/2): there the
    requantized scale is one lower and the codes double; the values are identical everywhere."""
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(6))
    q = quantize_ref(x, "mxfp8")
    q2 = quantize_ref(dequantize_ref(q), "mxfp8")
    assert bits_equal(dequantize_ref(q), dequantize_ref(q2))
    edge = q.codes.float().abs().unflatten(-1, (-1, 32)).amax(-1) == 224.0
    assert edge.any() and (~edge).any()
    assert torch.equal(q2.scales.to(torch.int32), q.scales.to(torch.int32) - edge.to(torch.int32))
    same = (~edge).repeat_interleave(32, -1)
    assert bits_equal(q.codes[same], q2.codes[same])


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match=r"shape \(3, 48\).*block size 32"):
        quantize_ref(torch.randn(3, 48), "mxfp8")
    with pytest.raises(ValueError, match="unknown MX scale_mode 'ceil'"):
        quantize_ref(torch.randn(2, 32), "mxfp8", scale_mode="ceil")
    with pytest.raises(ValueError, match="no quantized storage"):
        quantize_ref(torch.randn(2, 32), "bf16")
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        quantize_ref(torch.randn(2, 32), "mxfp8", axis=2)
