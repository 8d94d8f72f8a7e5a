"""Triton quantizers equal the reference byte for byte (interpreter on CPU, small shapes)."""
import pytest
import torch

from helpers import (
    assert_same,
    edge_tensor,
    force_one_read_tile,
    force_tile,
    one_read_tile_cases,
    record_calls,
    slice_tile_cases,
    tile_sweep,
)

triton = pytest.importorskip("triton")

from autoprec.formats import get_format
from autoprec.kernels import quantize_ref, rht_ref, rht_signs
from autoprec.kernels.core.quantized import QuantCopy as Side
from autoprec.kernels.core.random_bits import M32, StepStream, mix32, sr_bits, sr_stream, stream_keys
from autoprec.kernels.dispatch.dense import dual_problem
from autoprec.kernels.reference.rounding import e2m1_encode, round_to_element
from autoprec.kernels.triton import autotune
from autoprec.kernels.triton import quantize_cols as qc
from autoprec.kernels.triton import quantize_rows as qt
from autoprec.kernels.triton.numerics import round_and_encode, sr_hash_bits
from autoprec.kernels.triton.quantize import quantize_triton
from autoprec.kernels.triton.quantize_dual import quantize_dual_triton
from autoprec.kernels.triton.quantize_rows import index_strides

tl = triton.language
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def check(x, fmt, axis, sr, rht, hashed=False, **opts):
    """Triton against the reference; ``hashed``: the kernel computes the SR bits from the stream."""
    stream = sr_stream(7, 2**32 - 3)
    rand = sr_bits(x.shape, stream) if sr else None
    src = rht_ref(x, axis) if rht else x
    ref = quantize_ref(src, fmt, axis, rounding="sr" if sr else "rne", rand=rand, **opts)
    bits = dict(seed=stream) if sr and hashed else dict(rand=None if rand is None else rand.to(DEVICE))
    got = quantize_triton(x.to(DEVICE), get_format(fmt), axis, rht=rht, **bits, **opts)
    assert_same(got, ref)


@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
@pytest.mark.parametrize("sr", [False, True], ids=["rne", "sr"])
@pytest.mark.parametrize("axis", [1, 0], ids=["rows", "cols"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8", "mxfp8_e5m2"])
def test_quantize_matches_reference(fmt, axis, sr, rht):
    check(edge_tensor(64, 96), fmt, axis, sr, rht)


@pytest.mark.parametrize("config", tile_sweep(qt.CONFIGS))
def test_every_autotuned_tile_matches_reference(monkeypatch, config):
    """Each tile a GPU may pick (the interpreter runs the first alone): partial tiles in both dims (96 x 160),
    rows, hashed SR with RHT, NVFP4's 16x16 tiles (rows and columns: column copies in 16x16 tiles stay with these
    kernels). On a GPU, MXFP8 only at the tiles it is tuned over (the first was wrong on a GPU)."""
    force_tile(monkeypatch, (qt._nvfp4_kernel, qt._mxfp8_kernel), config)
    x = edge_tensor(96, 160)
    for fmt in ("nvfp4", "mxfp8") if DEVICE == "cpu" or config in qt.MXFP8_GPU_CONFIGS else ("nvfp4",):
        check(x, fmt, 1, False, False)
        check(x, fmt, 1, True, True, hashed=True)
    for axis in (1, 0):
        check(x, "nvfp4", axis, True, False, tile2d=True)


@pytest.mark.parametrize("fmt,config", tile_sweep(slice_tile_cases()))
def test_every_column_tile_matches_reference(monkeypatch, fmt, config):
    """Column copies (blocks down a strided dim) go to the slice kernels: each of their GPU tiles forced (the
    first of each format in the default run, the rest slow: every other test runs the interpreter's tile), on partial
    tiles in both dims (160 x 96 quantized down its 160 rows), RNE, SR with its bits hashed (from the stream, or
    from a ``StepStream``'s step read by the kernel) or loaded, RHT (NVFP4's amax pass in slices then), and a
    transposed view read with unit index stride."""
    force_tile(monkeypatch, (qc._nvfp4_cols_kernel, qc._mxfp8_cols_kernel), config)
    x = edge_tensor(160, 96)
    calls = []
    record_calls(monkeypatch, qc, "quantize_cols", calls)
    check(x, fmt, 0, False, False)
    check(x, fmt, 0, True, True, hashed=True)
    check(x, fmt, 0, True, False)
    check(x.t(), fmt, 1, True, True)
    step = StepStream(7, torch.tensor(2**32 - 3, device=DEVICE))
    got, want = (quantize_triton(x.to(DEVICE), get_format(fmt), 0, seed=seed, rht=True)
                 for seed in (step, sr_stream(7, 2**32 - 3)))
    assert_same(got, want)
    assert len(calls) == 6


def test_strided_reads_tune_only_over_tiles_a_gpu_has_checked():
    """Rows tune over every tile; a column copy (strided block axis) only over those a GPU ran, since the one
    tile it showed wrong was wrong for strided reads alone."""
    prune = qt._nvfp4_kernel.early_config_prune
    assert prune(qt.CONFIGS, {"s_k": 1}) == qt.CONFIGS
    assert prune(qt.CONFIGS, {"s_k": 4096}) == qt.GPU_CHECKED
    assert prune(qt.MXFP8_GPU_CONFIGS, {"s_k": 4096}) == qt.GPU_CHECKED[1:]


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


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
@pytest.mark.parametrize("shape,axis", [((64, 96), 1), ((64, 96), 0), ((3, 16, 64), 2), ((2, 64, 48), 1)],
                         ids=["rows", "cols", "3d-last", "3d-middle"])
def test_sr_bits_hashed_in_the_kernel(fmt, shape, axis):
    """Given the stream instead of the bits, the kernel hashes each element's index itself (the 3D
    middle-axis case materialises them): the same codes as the reference with sr_bits."""
    assert (index_strides(torch.Size(shape), axis) is None) == (shape == (2, 64, 48))  # hashed, or not
    x = torch.stack([edge_tensor(*shape[-2:], seed=i) for i in range(shape[0])]) if len(shape) == 3 else None
    check(edge_tensor(*shape) if x is None else x, fmt, axis, True, False, hashed=True)
    if len(shape) == 2:
        check(edge_tensor(*shape), fmt, axis, True, True, hashed=True)
        check(edge_tensor(*shape).t(), fmt, 1 - axis, True, False, hashed=True)  # a strided input


@triton.jit
def _bits_kernel(idx_ptr, keys_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    idx = tl.load(idx_ptr + i)
    out = sr_hash_bits(idx, tl.load(keys_ptr).to(tl.uint32), tl.load(keys_ptr + 1).to(tl.uint32))
    tl.store(out_ptr + i, out)


def test_hashed_bits_of_indices_past_2_to_the_32():
    """The kernel's hash takes both 32-bit halves of an index, as sr_bits does for tensors of > 2**32
    elements: checked on single indices there, against the torch formula."""
    stream = sr_stream(2**31 - 1, 12345)
    idx = torch.tensor([0, 1, 2**31, 2**32 - 1, 2**32, 2**32 + 17, 2**40 + 3, 2**47 - 1], dtype=torch.int64)
    k1, k2 = stream_keys(stream)
    want = (mix32(mix32((idx & M32) ^ k1) ^ k2 ^ (idx >> 32)) >> 8).to(torch.int32)
    out = torch.empty(8, dtype=torch.int32, device=DEVICE)
    _bits_kernel[(1,)](idx.to(DEVICE), torch.tensor([k1, k2], dtype=torch.int64, device=DEVICE), out, N=8)
    assert torch.equal(out.cpu(), want)
    assert torch.equal(sr_bits((3, 5), stream).flatten(), want.new_tensor(
        [(mix32(mix32(i ^ k1) ^ k2) >> 8) for i in range(15)]))


@triton.jit
def _encode_kernel(x_ptr, rand_ptr, out_ptr, N: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr,
                   EMIN: tl.constexpr, MAX: tl.constexpr, SR: tl.constexpr, NAN_CODE: tl.constexpr):
    i = tl.program_id(0) * 1024 + tl.arange(0, 1024)
    x, rand = tl.load(x_ptr + i, mask=i < N), tl.load(rand_ptr + i, mask=i < N)
    tl.store(out_ptr + i, round_and_encode(x, rand, EBITS, MBITS, EMIN, MAX, SR, NAN_CODE), mask=i < N)


@pytest.mark.parametrize("sr", [False, True], ids=["rne", "sr"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8", "mxfp8_e5m2"])
def test_round_and_encode_equals_rounding_then_encoding(fmt, sr):
    """The quantizers' one-pass element code, on every bf16 bit pattern, at three scalings that put each
    grid's subnormals, binade carries and saturation under every pattern, plus fp32 subnormals, and fp32 values
    one ulp either side of each grid midpoint (bf16 patterns carry 8 significant bits, a midpoint's neighbours
    24), against the reference's round_to_element then encoding (torch's cast for FP8, e2m1_encode for E2M1)."""
    elem = get_format(fmt).elem
    pattern = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    grid = round_to_element(pattern[pattern.isfinite()], elem).unique()
    mids = (grid[1:] + grid[:-1]) / 2
    mids = mids[mids.isfinite()]
    near = torch.cat([mids, torch.nextafter(mids, torch.tensor(float("inf"))),
                      torch.nextafter(mids, torch.tensor(float("-inf")))])
    x = torch.cat([pattern, pattern * 2.0**-120, pattern * 2.0**100, near,
                   torch.tensor([1e-40, -3e-42, 2.0**-149])])
    rand = sr_bits(x.shape, sr_stream(3, 1)) if sr else torch.zeros(x.shape, dtype=torch.int32)
    got = torch.empty(x.shape, dtype=torch.int32, device=DEVICE)
    nan_code = 0 if fmt == "nvfp4" else 0x7F
    _encode_kernel[(triton.cdiv(x.numel(), 1024),)](x.to(DEVICE), rand.to(DEVICE), got, N=x.numel(),
                                                    EBITS=elem.ebits, MBITS=elem.mbits, EMIN=elem.emin,
                                                    MAX=elem.max, SR=sr, NAN_CODE=nan_code)
    v = round_to_element(x, elem, rand if sr else None)
    want = e2m1_encode(v) if fmt == "nvfp4" else v.to(elem.torch_dtype).view(torch.uint8)
    assert torch.equal(got.cpu(), want.to(torch.int32))


def test_nvfp4_rounds_every_tie_to_even():
    """Values landing exactly on each E2M1 midpoint (and beside it), through a power-of-two tensor scale:
    amax 5.25 gives S_enc 512 and the second row's block scale 256, so its values are scaled by exactly 2."""
    x = torch.zeros(2, 32)
    x[0, 0] = 5.25
    mids = torch.tensor([0.125, 0.375, 0.625, 0.875, 1.25, 1.75, 2.5, 3.0])  # x2: 0.25, 0.75, ... 5, 6
    x[1] = torch.cat([mids, -mids, mids * (1 + 2.0**-20), -mids * (1 - 2.0**-20)])
    check(x, "nvfp4", 1, False, False)


@pytest.mark.parametrize("where", [(0, 0), (207, 319), (70, 130)])
def test_amax_pass_folds_many_tiles_per_program(monkeypatch, where):
    """With 3 programs for 20 tiles (the GPU's amax tiles: rows, and columns with the RHT in slices, 14 tiles) each
    program folds several tiles into its one atomic: the tensor scale still sees the largest value wherever it lies
    (first tile, last partial tile, a middle one)."""
    for module in (qt, qc):
        monkeypatch.setattr(module, "AMAX_PROGRAMS", 3)
    monkeypatch.setattr(autotune, "interpreting", lambda: False)  # the amax passes' GPU tiles
    x = torch.randn(208, 320, generator=torch.Generator().manual_seed(5))
    x[where] = -40.0
    check(x, "nvfp4", 1, False, False)
    check(x, "nvfp4", 0, True, True, hashed=True)


def test_all_zero_and_all_nan_tensors():
    check(torch.zeros(16, 32), "nvfp4", 1, False, False)
    check(torch.full((16, 32), float("nan")), "nvfp4", 1, False, False)
    check(torch.zeros(16, 32), "mxfp8", 1, False, False)


def test_custom_rht_signs():
    x = torch.randn(16, 64)
    signs = rht_signs(123)
    ref = quantize_ref(rht_ref(x, 1, signs), "nvfp4", 1)
    assert_same(quantize_triton(x.to(DEVICE), get_format("nvfp4"), 1, rht=True, rht_signs_=signs), ref)


def _reference_copy(x, fmt, axis, side: Side):
    """One copy as the reference makes it: blocked along ``axis`` of x, quantized as x or (transposed_source)
    as x.t()."""
    src, axis = (x.t(), 1 - axis) if side.transposed_source else (x, axis)
    rand = None if side.seed is None else sr_bits(src.shape, side.seed)
    src = rht_ref(src, axis) if side.rht else src
    return quantize_ref(src, fmt, axis, rounding="rne" if side.seed is None else "sr", rand=rand)


@pytest.mark.parametrize("sides", [
    (Side(), Side(rht=True)),  # an activation: fprop rowwise, wgrad columnwise with the RHT
    (Side(seed=sr_stream(3, 9)), Side(seed=sr_stream(4, 9), rht=True, transposed_source=True)),  # a gradient
    (Side(seed=sr_stream(5, 2**32 - 1), rht=True), Side()),
    (Side(seed=sr_stream(6, 1), transposed_source=True), Side(seed=sr_stream(7, 1))),  # rows read through x.t()
], ids=["activation", "gradient", "rows-rht", "rows-transposed"])
@pytest.mark.parametrize("fmt,shape", [("nvfp4", (48, 80)), ("nvfp4", (128, 64)), ("mxfp8", (96, 160)),
                                       ("mxfp8_e5m2", (32, 64))])
def test_dual_quantizer_writes_both_copies_of_the_references(fmt, shape, sides):
    """One kernel, both copies: each byte for byte the reference's, on tiles that overhang the tensor."""
    x = edge_tensor(*shape)
    rows, cols = quantize_dual_triton(x.to(DEVICE), get_format(fmt), *sides)
    assert_same(rows, _reference_copy(x, fmt, 1, sides[0]))
    assert_same(cols, _reference_copy(x, fmt, 0, sides[1]))


@pytest.mark.parametrize("fmt,config", tile_sweep(one_read_tile_cases()))
def test_every_dual_tile_matches_reference(monkeypatch, fmt, config):
    """Each tile a GPU may pick for the one-read kernels (the interpreter runs the first alone), tiles overhanging
    the tensor: both copies of a gradient (SR both ways, RHT and a transposed source on the columnwise one)."""
    force_one_read_tile(monkeypatch, fmt, config)
    sides = (Side(seed=sr_stream(3, 9)), Side(seed=sr_stream(4, 9), rht=True, transposed_source=True))
    x = edge_tensor(96, 160)
    rows, cols = quantize_dual_triton(x.to(DEVICE), get_format(fmt), *sides)
    assert_same(rows, _reference_copy(x, fmt, 1, sides[0]))
    assert_same(cols, _reference_copy(x, fmt, 0, sides[1]))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_dual_quantizer_reads_a_step_streams_step_on_the_device(monkeypatch, fmt):
    """Copies whose streams are ``StepStream``s (as the graph's op passes them) hash the bits of the streams at
    their steps, each copy's own, with the steps read by the kernel: the host never reads them."""
    steps = [torch.tensor(s, device=DEVICE) for s in (2**32 - 3, 5)]
    x = edge_tensor(96, 160)
    sides = (Side(StepStream(3, steps[0])), Side(StepStream(4, steps[1]), rht=True, transposed_source=True))
    monkeypatch.setattr(StepStream, "__int__", lambda self: pytest.fail("the step was read on the host"))
    rows, cols = quantize_dual_triton(x.to(DEVICE), get_format(fmt), *sides)
    monkeypatch.undo()
    ints = (Side(sr_stream(3, 2**32 - 3)), Side(sr_stream(4, 5), rht=True, transposed_source=True))
    assert_same(rows, _reference_copy(x, fmt, 1, ints[0]))
    assert_same(cols, _reference_copy(x, fmt, 0, ints[1]))


def test_dual_quantizer_names_what_it_cannot_take():
    assert "multiple of 32" in dual_problem(torch.zeros(48, 64), get_format("mxfp8"))
    assert dual_problem(torch.zeros(48, 64), get_format("nvfp4")) is None
