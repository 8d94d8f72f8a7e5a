"""The fused C quantizer (kernels/cpu/fused.py) against the pure-torch references, bit for bit."""
import itertools

import pytest
import torch

from autoprec.formats import get_format
from autoprec.kernels import dequantize_ref, quantize_ref, rht_ref, rht_signs
from autoprec.kernels.core.random_bits import sr_bits
from autoprec.kernels.cpu import fused as cpu_fused
from autoprec.kernels.dispatch import dense as dispatch

from helpers import bits_equal, edge_tensor

pytestmark = pytest.mark.skipif(cpu_fused.unavailable_reason() is not None,
                                reason=f"fused CPU kernels: {cpu_fused.unavailable_reason()}")

# (format, options) x axis x SR x RHT: every quantizer configuration a plan can ask for
FORMATS = [("nvfp4", {}), ("nvfp4", {"tile2d": True}), ("mxfp8", {}), ("mxfp8", {"scale_mode": "floor"}),
           ("mxfp8_e5m2", {}), ("mxfp8_e5m2", {"scale_mode": "floor"})]
CASES = list(itertools.product(range(len(FORMATS)), [0, 1], [False, True], [False, True]))


def inputs(tile2d: bool, axis: int) -> list[torch.Tensor]:
    """Edge blocks (NaN, ±Inf, zero, tiny, huge), small and large scales (E8M0 code 0, i.e. 2**-127, an fp32
    subnormal, at the smallest), and a 3D activation."""
    xs = [edge_tensor(64, 96), edge_tensor(96, 64, seed=1) * 1e-3, torch.randn(32, 64) * 300,
          torch.randn(32, 64) * 2.0**-125]
    if not tile2d:
        xs.append(torch.randn(32, 3, 64) if axis == 0 else torch.randn(3, 64, 5))  # dims after the block axis
    return xs


@pytest.mark.parametrize("fi,axis,sr,rht", CASES, ids=[f"{FORMATS[f][0]}{FORMATS[f][1] or ''}-ax{a}-sr{s}-rht{r}"
                                                     for f, a, s, r in CASES])
def test_fused_quantize_matches_reference(fi, axis, sr, rht):
    fmt, opts = FORMATS[fi]
    for x in inputs(opts.get("tile2d", False), axis):
        stream = 0x1234_0000_0007 if sr else None
        xr = rht_ref(x, axis, rht_signs(3)) if rht else x
        want = quantize_ref(xr, fmt, axis, rounding="sr" if sr else "rne",
                            rand=sr_bits(x.shape, stream) if sr else None, **opts)
        got = cpu_fused.quantize_cpu(x, get_format(fmt), axis, seed=stream, rht=rht, rht_signs=rht_signs(3), **opts)
        assert bits_equal(got.codes.view(torch.uint8), want.codes.view(torch.uint8))
        assert bits_equal(got.scales, want.scales) and got.tile_rows == want.tile_rows
        assert want.tensor_scale is None or bits_equal(got.tensor_scale, want.tensor_scale)
        assert bits_equal(cpu_fused.dequantize_cpu(got).contiguous(), dequantize_ref(want).contiguous())


def nvfp4_ties() -> torch.Tensor:
    """A tensor whose second 16-block lands exactly on E2M1 midpoints: tensor amax 5.25 makes S_enc 512, a
    power of two, and block amax 3 then gets block scale 256, so the block's values are scaled by exactly 2."""
    x = torch.zeros(2, 16)
    x[0, 0] = 5.25
    mids = torch.tensor([0.125, 0.375, 0.625, 0.875, 1.25, 1.75, 2.5, 3.0])  # x2: 0.25 0.75 ... 5, 6
    x[1] = torch.cat([mids, -mids])
    return x


@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_nvfp4_ties_round_to_even(layout):
    """Values exactly between two E2M1 magnitudes round to the even code in both C paths, as the reference."""
    x = nvfp4_ties()
    src, axis = (x, 1) if layout == "rows" else (x.t().contiguous(), 0)
    got = cpu_fused.quantize_cpu(src, get_format("nvfp4"), axis)
    want = quantize_ref(src, "nvfp4", axis)
    assert bits_equal(got.codes, want.codes) and bits_equal(got.scales, want.scales)
    low, high = got.codes[1] & 0xF, got.codes[1] >> 4
    codes = torch.stack([low, high], -1).flatten()
    # 0.25->0  0.75->1.0  1.25->1.0  1.75->2.0  2.5->2.0  3.5->4.0  5->4.0  6->6  (codes 0 2 2 4 4 6 6 7)
    assert codes[:8].tolist() == [0, 2, 2, 4, 4, 6, 6, 7] and codes[8:].tolist() == [8, 10, 10, 12, 12, 14, 14, 15]


def fp8_midpoints(fmt: str) -> torch.Tensor:
    """Blocks of 32 led by the format's max (so the E8M0 scale is 1 and values are rounded as they are)
    holding every midpoint between neighbouring FP8 values, the fp32 numbers either side of each, and their
    negatives: every tie and near-tie of round-to-nearest-even, subnormal ones included."""
    dtype = get_format(fmt).elem.torch_dtype
    grid = torch.arange(128, dtype=torch.uint8).view(dtype).float()
    grid = grid[torch.isfinite(grid)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    vals = torch.cat([mids, torch.nextafter(mids, torch.zeros(())), torch.nextafter(mids, grid[-1:] * 2), grid])
    vals = torch.cat([vals, -vals])
    per_block = 31
    vals = torch.cat([vals, torch.zeros(-len(vals) % per_block)]).reshape(-1, per_block)
    return torch.cat([torch.full((len(vals), 1), float(grid[-1])), vals], 1)


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp8_e5m2"])
@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_fp8_rounds_every_tie_as_the_reference(fmt, layout):
    """MXFP8 round-to-nearest-even in both C paths, at every midpoint of the FP8 grid and beside it."""
    x = fp8_midpoints(fmt)
    src, axis = (x, 1) if layout == "rows" else (x.t().contiguous(), 0)
    got = cpu_fused.quantize_cpu(src, get_format(fmt), axis)
    want = quantize_ref(src, fmt, axis)
    assert bool((want.scales == 127).all())  # scale 1: the values above are what gets rounded
    assert bits_equal(got.codes.view(torch.uint8), want.codes.view(torch.uint8))


COLUMN_INPUTS = {  # blocks that run across memory rows: (tensor, block axis)
    "tokens-of-activation": (lambda: edge_tensor(64, 96), 0),
    "transposed-view": (lambda: edge_tensor(96, 64, seed=2).t(), 1),
    "batched": (lambda: torch.randn(2, 64, 48) * 50, 1),
    "batched-transposed-view": (lambda: torch.randn(2, 64, 40).transpose(1, 2), 2),
    "bf16-tokens": (lambda: (torch.randn(64, 48) * 7).bfloat16(), 0),  # converted once, strides kept
    "wide-ragged": (lambda: torch.randn(32, 301) * 3, 0),  # a second tile of 45 columns: 8x8 blocks and 5 single ones
}


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8", "mxfp8_e5m2"])
@pytest.mark.parametrize("rounding,rht", [("rne", False), ("sr", False), ("sr", True)])
@pytest.mark.parametrize("case", list(COLUMN_INPUTS))
def test_column_kernels_read_in_place_and_match_the_reference(monkeypatch, fmt, rounding, rht, case):
    """Operands blocked across memory rows (a wgrad operand's tokens) go through the column kernels,
    without a transposed copy, and give the reference's bits: codes, scales, SR bits, RHT."""
    make, axis = COLUMN_INPUTS[case]
    x = make()
    used = []
    real = cpu_fused._quantize_cols
    monkeypatch.setattr(cpu_fused, "_quantize_cols", lambda *a, **k: used.append(1) or real(*a, **k))
    got = dispatch.quantize(x, fmt, axis, rounding=rounding, seed=21, rht=rht, rht_signs=rht_signs(4))
    xr = rht_ref(x, axis, rht_signs(4)) if rht else x
    want = quantize_ref(xr, fmt, axis, rounding=rounding, rand=sr_bits(x.shape, 21) if rounding == "sr" else None)
    assert used
    assert bits_equal(got.codes.view(torch.uint8), want.codes.view(torch.uint8))
    assert bits_equal(got.scales, want.scales)
    assert want.tensor_scale is None or bits_equal(got.tensor_scale, want.tensor_scale)
    assert bits_equal(dispatch.dequantize(got).contiguous(), dequantize_ref(want).contiguous())


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8", "mxfp8_e5m2"])
@pytest.mark.parametrize("rounding", ["rne", "sr"])
@pytest.mark.parametrize("shape", [(64, 96), (3, 40, 64)])
@pytest.mark.parametrize("index", ["tensor", "slice"])
def test_quantizing_some_rows_gives_those_rows_of_the_whole(fmt, rounding, shape, index):
    """``quantize(rows=...)`` quantizes only the rows calibration samples, bit-identical to the whole
    tensor's quantization restricted to them: the tensor scale (a huge value in an unsampled row sets it)
    and the SR bits come from the whole tensor. Sliced rows are read in place."""
    x = torch.randn(shape)
    x[..., 1, 5] = 1e4  # row 1 is not sampled; it alone sets NVFP4's tensor scale
    x[..., 4, :32] = float("nan")
    rows = torch.arange(0, shape[-2], 4) if index == "tensor" else slice(0, shape[-2], 4)
    in_place = cpu_fused._row_offsets.cache_info()
    got = dispatch.quantize(x, fmt, rounding=rounding, seed=11, rows=rows)
    after = cpu_fused._row_offsets.cache_info()
    assert (after.hits + after.misses > in_place.hits + in_place.misses) == (index == "slice")
    whole = quantize_ref(x, fmt, rounding=rounding, rand=sr_bits(x.shape, 11) if rounding == "sr" else None)
    assert got.shape == (*shape[:-2], len(range(0, shape[-2], 4)), shape[-1])
    assert bits_equal(got.codes.view(torch.uint8), whole.codes[..., rows, :].view(torch.uint8))
    assert bits_equal(got.scales, whole.scales[..., rows, :])
    assert whole.tensor_scale is None or bits_equal(got.tensor_scale, whole.tensor_scale)
    assert bits_equal(dispatch.dequantize(got), dequantize_ref(whole)[..., rows, :])


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_quantizing_some_columns_of_an_operand_blocked_along_dim_minus_2(fmt):
    """A matmul's second operand (K, N), blocked along K: ``rows`` then picks columns."""
    x = torch.randn(2, 64, 48)
    x[1, 3, 7] = -3e3
    cols = torch.arange(0, 48, 5)
    got = dispatch.quantize(x, fmt, axis=1, rounding="sr", seed=5, rows=cols)
    whole = quantize_ref(x, fmt, axis=1, rounding="sr", rand=sr_bits(x.shape, 5))
    assert got.shape == (2, 64, len(cols))
    assert bits_equal(got.codes.view(torch.uint8), whole.codes[..., cols, :].view(torch.uint8))
    assert bits_equal(dispatch.dequantize(got), dequantize_ref(whole)[..., cols])


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
@pytest.mark.parametrize("axis", [1, 2])
@pytest.mark.parametrize("rht", [False, True])
def test_quantizing_some_batch_items_of_a_batched_operand(fmt, axis, rht):
    """A batched product's operand: some batch items and rows (or columns), bits of the whole tensor
    (with the RHT, the tensor scale of the whole transformed tensor)."""
    x = torch.randn(5, 64, 64)
    x[0, 3, 7] = 5e3  # batch item 0 is not sampled; it alone sets NVFP4's tensor scale
    batches, rows = slice(1, 5, 2), slice(0, 64, 8)
    got = dispatch.quantize(x, fmt, axis, rounding="sr", seed=3, rows=rows, batches=batches, rht=rht,
                            rht_signs=rht_signs(2))
    xr = rht_ref(x, axis, rht_signs(2)) if rht else x
    whole = quantize_ref(xr, fmt, axis, rounding="sr", rand=sr_bits(x.shape, 3))
    assert bits_equal(got.codes.view(torch.uint8), whole.codes[batches][..., rows, :].view(torch.uint8))
    assert bits_equal(got.scales, whole.scales[batches][..., rows, :])
    want = dequantize_ref(whole)[batches]
    assert bits_equal(dispatch.dequantize(got), want[..., rows, :] if axis == 2 else want[..., rows])


def test_quantizing_rows_needs_the_block_axis_among_the_last_two():
    with pytest.raises(ValueError, match="rows"):
        dispatch.quantize(torch.randn(64, 32, 8), "mxfp8", axis=0, rows=torch.arange(0, 32, 4))


def test_dispatch_runs_the_fused_kernels_by_default(monkeypatch):
    """``auto`` on CPU takes the C path, ``ref`` the reference; both give the same bits, SR included."""
    calls = []
    real = cpu_fused.quantize_cpu
    monkeypatch.setattr(cpu_fused, "quantize_cpu", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(64, 128)
    fused = dispatch.quantize(x, "nvfp4", 0, rounding="sr", seed=9, rht=True)
    assert calls
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    ref = dispatch.quantize(x, "nvfp4", 0, rounding="sr", seed=9, rht=True)
    assert len(calls) == 1 and bits_equal(fused.codes, ref.codes) and bits_equal(fused.scales, ref.scales)
    assert bits_equal(dispatch.dequantize(fused), dequantize_ref(ref))


def test_without_a_compiler_the_reference_runs(monkeypatch, tmp_path):
    """No C compiler: the reason names it, and quantization still runs (the reference, same bits)."""
    monkeypatch.setenv("AUTOPREC_CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("AUTOPREC_CACHE", str(tmp_path))
    cpu_fused._library.cache_clear()
    try:
        assert "no C compiler" in cpu_fused.unavailable_reason() and "no-such-cc" in cpu_fused.unavailable_reason()
        x = torch.randn(32, 64)
        assert bits_equal(dispatch.quantize(x, "mxfp8").codes, quantize_ref(x, "mxfp8").codes)
    finally:
        cpu_fused._library.cache_clear()


def test_an_unwritable_cache_is_named(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("AUTOPREC_CACHE", str(blocker / "cache"))  # below a file: cannot be created
    cpu_fused._library.cache_clear()
    try:
        assert "AUTOPREC_CACHE" in cpu_fused.unavailable_reason()
        x = torch.randn(32, 64)
        assert bits_equal(dispatch.quantize(x, "nvfp4").codes, quantize_ref(x, "nvfp4").codes)
    finally:
        cpu_fused._library.cache_clear()
