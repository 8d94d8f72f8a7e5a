"""FP8 block scaling: the reference quantizer bit for bit against an independent numpy / ml_dtypes oracle written
from Transformer Engine's documented algorithm (fp32 encode factor 448/amax with its mantissa cleared, E4M3 cast of
x times it, the decode factor stored), 1x128 blocks and 128x128 tiles, edge cases, and the ops' layouts."""
import ml_dtypes
import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import autoprec.kernels.ops  # noqa: F401  (registers torch.ops.autoprec)
from autoprec.kernels import dequantize_ref, qmm_ref, quantize, quantize_ref, scaled_mm

from helpers import bits_equal


def oracle(x: np.ndarray, tile: int) -> tuple[np.ndarray, np.ndarray]:
    """(E4M3 values as float32, fp32 decode scales) of 2D fp32 ``x`` blocked along its rows, 1x128 blocks
    (``tile`` 1) or 128x128 tiles (``tile`` 128)."""
    rows, k = x.shape
    vals = np.zeros_like(x)
    scales = np.zeros((rows // tile, k // 128), np.float32)
    for r in range(0, rows, tile):
        for c in range(0, k, 128):
            block = x[r:r + tile, c:c + 128]
            finite = np.isfinite(block)
            amax = np.float32(np.abs(np.where(finite, block, 0)).max())
            if amax == 0:
                enc = np.float32(1.0)
            else:
                with np.errstate(over="ignore", divide="ignore"):
                    q = np.float32(448.0) / amax
                q = np.float32(np.finfo(np.float32).max) if np.isinf(q) else q
                enc = np.array([q], np.float32).view(np.uint32) & np.uint32(0xFF800000)
                enc = enc.view(np.float32)[0]
            scaled = np.clip(block * enc, -448.0, 448.0)
            vals[r:r + tile, c:c + 128] = scaled.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
            scales[r // tile, c // 128] = np.float32(1.0) / enc if finite.all() else np.nan
    return vals, scales


def wide_range(rows: int, k: int, seed: int) -> torch.Tensor:
    """Values spread over many binades, with per-block magnitudes from 2^-130 to 2^100."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.exp2(torch.randint(-8, 8, (rows, k), generator=g).float())
    block_scale = torch.exp2(torch.randint(-130, 100, (rows, k // 128), generator=g).float())
    return x * block_scale.repeat_interleave(128, 1)


@pytest.mark.parametrize("tile2d", [False, True], ids=["1x128", "128x128"])
@pytest.mark.parametrize("seed", [0, 1])
def test_reference_equals_the_oracle_bit_for_bit(tile2d, seed):
    x = wide_range(256, 384, seed)
    x[3, 130:140] = 0.0  # a partly zero block
    x[128:256, 256:384] = 0.0 if tile2d else x[128:256, 256:384]  # a whole zero tile
    x[5, :128] = 0.0  # a zero block
    x[7, :128] = 0.0
    x[7, 0] = 1e-45  # a subnormal amax (1x128): the encode factor overflows to FLT_MAX, the scale is 2**-127
    q = quantize_ref(x, "fp8_block", 1, tile2d=tile2d)
    want_vals, want_scales = oracle(x.numpy(), 128 if tile2d else 1)
    assert q.codes.dtype == torch.float8_e4m3fn and q.scales.dtype == torch.float32
    assert torch.equal(q.codes.float(), torch.from_numpy(want_vals))
    assert bits_equal(q.scales, torch.from_numpy(want_scales))
    assert tile2d or q.scales[7, 0] == 2.0**-127
    dec = torch.from_numpy(want_vals) * torch.from_numpy(want_scales).repeat_interleave(
        128 if tile2d else 1, 0).repeat_interleave(128, 1)
    assert bits_equal(dequantize_ref(q), dec)


def test_scales_are_powers_of_two_and_blocks_use_the_e4m3_range():
    x = wide_range(64, 256, 3)
    x = x[(x.abs().unflatten(-1, (-1, 128)).amax(-1) > 2.0**-100).all(-1)]  # blocks whose 2**e does not clamp
    assert x.shape[0] > 32
    q = quantize_ref(x, "fp8_block", 1)
    mantissa = q.scales.view(torch.int32) & 0x7FFFFF
    normal = (q.scales.view(torch.int32) >> 23) & 0xFF
    assert bool(((mantissa == 0) | (normal == 0)).all())  # a power of two (2^-127 is subnormal)
    amax_codes = q.codes.float().abs().unflatten(-1, (-1, 128)).amax(-1)
    assert bool(((amax_codes >= 224) & (amax_codes <= 448)).all())  # the block amax lands in E4M3's top binade


def test_non_finite_blocks_dequantize_to_nan_and_leave_the_others():
    x = torch.randn(4, 256)
    x[1, 3], x[2, 200] = float("nan"), float("inf")
    q = quantize_ref(x, "fp8_block", 1)
    assert torch.isnan(q.scales[1, 0]) and torch.isnan(q.scales[2, 1]) and not torch.isnan(q.scales[0]).any()
    d = dequantize_ref(q)
    assert torch.isnan(d[1, :128]).all() and torch.isfinite(d[1, 128:]).all()


def test_a_tile_quantized_along_either_dim_is_the_same_tile():
    """128x128 tiles are symmetric: a weight's quantization for fprop, transposed, is its dgrad's."""
    w = wide_range(256, 384, 4)
    rows = quantize_ref(w, "fp8_block", 1, tile2d=True)
    cols = quantize_ref(w.t().contiguous(), "fp8_block", 1, tile2d=True)
    assert torch.equal(rows.codes.float().t(), cols.codes.float()) and torch.equal(rows.scales.t(), cols.scales)


def test_blocks_along_dim_0_are_those_of_the_transpose():
    x = wide_range(256, 128, 5)
    q0 = quantize_ref(x, "fp8_block", 0)
    q1 = quantize_ref(x.t().contiguous(), "fp8_block", 1)
    assert q0.axis == 0 and torch.equal(q0.codes.float(), q1.codes.float()) and torch.equal(q0.scales, q1.scales)
    assert bits_equal(dequantize_ref(q0), dequantize_ref(q1).t().contiguous())


@pytest.mark.parametrize("shape,axis,tile2d,why", [
    ((64, 100), 1, False, "not a multiple of the block size 128"),
    ((64, 256), 1, True, "128x128 tiles need both dims"),
    ((2, 128, 128), 2, True, "128x128 tiles need a 2D tensor"),
])
def test_bad_shapes_are_named(shape, axis, tile2d, why):
    with pytest.raises(ValueError, match=why):
        quantize_ref(torch.randn(shape), "fp8_block", axis, tile2d=tile2d)


def test_ops_parts_round_trip_and_fake_shapes_match():
    """The op's uint8 parts (fp32 scales as bytes) rebuild the quantization, and the fake implementation
    gives the real parts' shapes, with and without tiles."""
    ops = torch.ops.autoprec
    step = torch.zeros((), dtype=torch.int64)
    for shape, tile2d in (((64, 256), False), ((384, 256), True)):
        x = torch.randn(shape)
        parts = ops.quantize(x, "fp8_block", 1, "rne", 0, tile2d, "rceil", False, 0, step)
        with FakeTensorMode():
            fake = ops.quantize(torch.empty(shape), "fp8_block", 1, "rne", 0, tile2d, "rceil", False, 0,
                                torch.zeros((), dtype=torch.int64))
        assert [p.shape for p in parts] == [f.shape for f in fake]
        values = ops.dequantize(*parts, "fp8_block", 1, list(shape), 128 if tile2d else 1)
        assert bits_equal(values, dequantize_ref(quantize_ref(x, "fp8_block", 1, tile2d=tile2d)))


def test_product_equals_the_reference_qmm():
    x, w = torch.randn(64, 256), torch.randn(256, 384)
    y = scaled_mm(quantize(x, "fp8_block", 1), quantize(w, "fp8_block", 0, tile2d=True))
    assert bits_equal(y, qmm_ref(x, w, "fp8_block", "fp8_block", tile2d_b=True))
    assert float((y - x @ w).norm() / (x @ w).norm()) < 0.05


@pytest.mark.parametrize("tile2d", [False, True], ids=["1x128", "128x128"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_quantizer_equals_the_reference(monkeypatch, tile2d, axis, dtype):
    """The Triton kernel in the interpreter, rows and a column copy read down a strided dim, NaN, Inf and zero
    blocks. bf16 inputs stay in the normal range: the interpreter's bf16 -> fp32 conversion mangles subnormals
    (for every quantizer), a GPU's does not."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr("autoprec.kernels.core.launch.INTERPRET", None)
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    x = wide_range(384, 256, 6) if dtype == torch.float32 else torch.randn(384, 256) * 2.0 ** 40
    x = x if axis == 0 else x.t().contiguous()  # blocks along dim 0: a strided read of the same tensor
    x[3, 5], x[200, 100], x[7, :] = float("nan"), float("inf"), 0.0
    x = x.to(dtype)
    got = quantize(x, "fp8_block", axis, tile2d=tile2d)
    want = quantize_ref(x, "fp8_block", axis, tile2d=tile2d)
    assert bits_equal(got.codes.view(torch.uint8), want.codes.view(torch.uint8))
    assert bits_equal(got.scales, want.scales) and got.tile_rows == want.tile_rows and got.axis == want.axis


def test_triton_quantizer_takes_3d_tensors_and_leaves_sr_to_the_reference(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr("autoprec.kernels.core.launch.INTERPRET", None)
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    x = torch.randn(2, 128, 256)
    for axis in (1, 2):
        got, want = quantize(x, "fp8_block", axis), quantize_ref(x, "fp8_block", axis)
        assert bits_equal(got.codes.view(torch.uint8), want.codes.view(torch.uint8))
        assert bits_equal(got.scales, want.scales)
    with pytest.raises(ValueError, match="rounds to nearest without the RHT"):
        quantize(x, "fp8_block", 2, rounding="sr")


@pytest.mark.parametrize("shape,axis,tile2d", [((256, 384), 1, False), ((256, 384), 0, False), ((256, 384), 1, True),
                                               ((256, 384), 0, True), ((2, 128, 256), 1, False),
                                               ((2, 128, 256), 2, False)])
@pytest.mark.parametrize("rounding", ["rne", "sr"])
def test_c_kernels_equal_the_reference(shape, axis, tile2d, rounding):
    """The fused CPU kernels (``AUTOPREC_KERNELS=auto`` on this CPU) quantize and dequantize as the reference does,
    the SR bits included, whatever the block axis; a part of the rows is the same part of the whole."""
    from autoprec.kernels.core.random_bits import sr_bits
    from autoprec.kernels.cpu import fused
    from autoprec.kernels.dispatch import dense

    if fused.unavailable_reason():
        pytest.skip(fused.unavailable_reason())
    x = wide_range(shape[0] * (shape[1] if len(shape) == 3 else 1), shape[-1], 7).reshape(shape)
    x.view(-1)[5], x.view(-1)[1000] = float("nan"), float("inf")
    got = quantize(x, "fp8_block", axis, tile2d=tile2d, rounding=rounding, seed=9)
    rand = sr_bits(x.shape, 9, x.device) if rounding == "sr" else None
    want = quantize_ref(x, "fp8_block", axis, tile2d=tile2d, rounding=rounding, rand=rand)
    assert bits_equal(got.codes.view(torch.uint8), want.codes.view(torch.uint8)) and bits_equal(got.scales, want.scales)
    assert bits_equal(dense.dequantize(got), dequantize_ref(want))
    if len(shape) == 2 and not tile2d:
        part = dense.quantize(x, "fp8_block", axis, rounding=rounding, seed=9, rows=slice(3, 40))
        assert bits_equal(part.scales, want.scales[3:40]) and part.shape[1 - axis] == 37
