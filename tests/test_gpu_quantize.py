"""On a CUDA GPU only (skipped elsewhere; CI has none): the quantizers dispatch runs there, byte for byte against
the CPU references at sizes the autotuned tiles cover several times over, each tile forced in turn (the tile
kernels' and the column copies' slice kernels'), and the one-read kernel of both copies (not run by dispatch on a
GPU yet) pair by pair."""
import pytest
import torch

from autoprec.formats import get_format
from autoprec.kernels.core import launch
from autoprec.kernels.core.quantized import QuantCopy
from autoprec.kernels.core.random_bits import sr_stream
from autoprec.kernels.dispatch import dense as dispatch
from autoprec.kernels.triton import quantize_cols as qc
from autoprec.kernels.triton import quantize_rows as qt
from autoprec.kernels.triton.quantize_dual import quantize_dual_triton

from helpers import (
    assert_same,
    case_ids,
    edge_tensor,
    force_one_read_tile,
    force_tile,
    mismatch,
    one_read_tile_cases,
    slice_tile_cases,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SEED = sr_stream(5, 11)


def assert_both_same(got, want) -> None:
    """Both copies of a pair (rows, columns) as ``want``'s, else a failure saying what differs in each."""
    problems = [f"{name}: {p}" for name, g, w in zip(("rows", "columns"), got, want) if (p := mismatch(g, w))]
    assert not problems, "; ".join(problems)


def gpu_and_ref(monkeypatch, fn, x):
    """``fn`` on the GPU copy of ``x`` in auto mode, then on ``x`` with the reference kernels."""
    got = fn(x.cuda())
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    return got, fn(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt,axis,opts", [
    ("nvfp4", 1, {}), ("nvfp4", 0, {}), ("nvfp4", 1, {"tile2d": True}),
    ("nvfp4", 1, {"rounding": "sr", "seed": SEED}), ("nvfp4", 0, {"rounding": "sr", "seed": SEED, "rht": True}),
    ("mxfp8", 1, {}), ("mxfp8", 0, {"scale_mode": "floor"}), ("mxfp8_e5m2", 1, {"rounding": "sr", "seed": SEED}),
    ("mxfp8_e5m2", 0, {}),  # RNE: on sm_89 and later the hardware's conversion, E4M3 and E5M2 alike
])
def test_gpu_quantize_equals_reference(monkeypatch, dtype, fmt, axis, opts):
    x = edge_tensor(768, 1536).to(dtype)
    got, want = gpu_and_ref(monkeypatch, lambda t: dispatch.quantize(t, fmt, axis, **opts), x)
    assert_same(got, want)


TILE_CASES = [("nvfp4", c) for c in qt.CONFIGS] + [("mxfp8", c) for c in qt.MXFP8_GPU_CONFIGS]


@pytest.mark.parametrize("fmt,config", TILE_CASES,
                         ids=case_ids(TILE_CASES))
def test_gpu_every_autotuned_tile_equals_reference(monkeypatch, fmt, config):
    """Each tile the kernel is tuned over, forced in turn (the autotuner picks by speed, and one MXFP8 tile, now
    left out of its list, was wrong on a GPU where the others were exact, for strided reads): rows, hashed SR
    with RHT, NVFP4's 16x16 tiles (rows and columns, the strided reads these kernels still make), on bf16 edge
    data."""
    force_tile(monkeypatch, (qt._nvfp4_kernel if fmt == "nvfp4" else qt._mxfp8_kernel,), config)
    x = edge_tensor(768, 1536).bfloat16()
    cases = [(1, {}), (1, {"rounding": "sr", "seed": SEED, "rht": True})]
    tiles = [(1, {"tile2d": True}), (0, {"tile2d": True})] if fmt == "nvfp4" else []
    for axis, opts in cases + tiles:
        assert_gpu_equals_reference(monkeypatch, x, axis, fmt, opts)


def assert_gpu_equals_reference(monkeypatch, x, axis, fmt, opts) -> None:
    got = dispatch.quantize(x.cuda(), fmt, axis, **opts)
    with monkeypatch.context() as m:
        m.setenv("AUTOPREC_KERNELS", "ref")
        want = dispatch.quantize(x, fmt, axis, **opts)
    problem = mismatch(got, want)
    assert problem is None, (axis, opts, problem)


COLUMN_TILE_CASES = slice_tile_cases()


@pytest.mark.parametrize("fmt,config", COLUMN_TILE_CASES, ids=case_ids(COLUMN_TILE_CASES))
def test_gpu_every_column_tile_equals_reference(monkeypatch, fmt, config):
    """The slice kernels of column copies (blocks down a strided dim), each tile forced: RNE, and SR with RHT,
    down the rows of bf16 edge data; SR along the rows of its transposed view (memory strided along them)."""
    force_tile(monkeypatch, (qc._nvfp4_cols_kernel, qc._mxfp8_cols_kernel), config)
    x = edge_tensor(768, 1536).bfloat16()
    sr = {"rounding": "sr", "seed": SEED}
    for src, axis, opts in ((x, 0, {}), (x, 0, sr | {"rht": True}), (x.t(), 1, sr)):
        assert_gpu_equals_reference(monkeypatch, src, axis, fmt, opts)


GRADIENT_PAIR = (QuantCopy(SEED), QuantCopy(SEED + 1, rht=True, transposed_source=True))


@pytest.mark.parametrize("fmt,rounding", [("nvfp4", "rne"), ("nvfp4", "sr"), ("mxfp8", "rne"), ("mxfp8_e5m2", "rne")])
def test_gpu_hardware_conversions_equal_the_integer_path(monkeypatch, fmt, rounding):
    """Rounding to nearest by the GPU's conversions (MXFP8 and NVFP4's block scales from sm_89, NVFP4's elements
    from sm_100: ``launch.hardware_fp8``, ``nvfp4_hardware``; NVFP4's block scales with SR elements too) writes
    the bytes the integer path writes on the same GPU, rows and column copies of bf16 edge data: a mismatch here
    names the conversions, where the reference tests above would not say which path."""
    x = edge_tensor(768, 1536).bfloat16().cuda()
    opts = {"rounding": rounding, "seed": SEED} if rounding == "sr" else {}
    hardware = [dispatch.quantize(x, fmt, axis, **opts) for axis in (1, 0)]
    monkeypatch.setattr(launch, "_capability", lambda index: (8, 0))  # a GPU without them: the integer path
    for axis, got in zip((1, 0), hardware):
        problem = mismatch(got, dispatch.quantize(x, fmt, axis, **opts))
        assert problem is None, (axis, problem)


@pytest.mark.parametrize("pair", [GRADIENT_PAIR, (QuantCopy(SEED), QuantCopy(SEED + 1, transposed_source=True)),
                                  (QuantCopy(), QuantCopy(rht=True))], ids=["gradient", "no_rht", "activation"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_gpu_dual_quantize_equals_two_references(monkeypatch, fmt, pair):
    """What a GPU runs for a pair (two quantizations; NVFP4's two tensor amaxes from one pass, with the RHT on one
    copy too: ``quantize_cols_triton.pair_amax``)."""
    x = edge_tensor(1024, 768).bfloat16()
    got, want = gpu_and_ref(monkeypatch, lambda t: dispatch.quantize_dual(t, fmt, *pair), x)
    assert_both_same(got, want)


def test_gpu_transpose_tiles_equals_reference():
    """A 16x16-tiled weight's dgrad copy, one Triton launch on a GPU, byte for byte the reference's torch ops."""
    w = dispatch.quantize(edge_tensor(768, 1024), "nvfp4", 1, tile2d=True)
    codes, scales = w.codes.view(torch.uint8), w.scales.view(torch.uint8)
    got = dispatch.transpose_tiles(codes.cuda(), scales.cuda())
    want = dispatch.transpose_tiles(codes, scales)
    assert all(torch.equal(g.cpu(), r) for g, r in zip(got, want))


ONE_READ_PAIRS = {  # (rows, columns): the gradient pair, then each of its parts alone
    "sr;sr+rht_of_xt": GRADIENT_PAIR,
    "rne;sr+rht_of_xt": (QuantCopy(), GRADIENT_PAIR[1]),
    "sr;sr+rht": (GRADIENT_PAIR[0], QuantCopy(SEED + 1, rht=True)),
    "sr;sr_of_xt": (GRADIENT_PAIR[0], QuantCopy(SEED + 1, transposed_source=True)),
    "sr;rht_of_xt": (GRADIENT_PAIR[0], QuantCopy(rht=True, transposed_source=True)),
}
ONE_READ_DATA = {"edge": lambda: edge_tensor(1024, 768),
                 "randn": lambda: torch.randn(1024, 768, generator=torch.Generator().manual_seed(1))}


ONE_READ_TILE_CASES = one_read_tile_cases()


@pytest.mark.parametrize("data", list(ONE_READ_DATA))
@pytest.mark.parametrize("pair", list(ONE_READ_PAIRS))
@pytest.mark.parametrize("fmt,config", ONE_READ_TILE_CASES, ids=case_ids(ONE_READ_TILE_CASES))
def test_gpu_one_read_kernel_equals_two_references(monkeypatch, fmt, config, pair, data):
    """The one-read kernel (dispatch runs two single quantizers on a GPU until this passes there) at each tile,
    for a gradient's pair and each part of it alone: bytes and fields of both copies as two quantizations make
    them, and how many bytes differ where they do not."""
    force_one_read_tile(monkeypatch, fmt, config)
    x = ONE_READ_DATA[data]().bfloat16()
    copies = ONE_READ_PAIRS[pair]
    kernel = quantize_dual_triton(x.cuda(), get_format(fmt), *copies)
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    want = dispatch.quantize_dual(x, fmt, *copies)
    assert_both_same(kernel, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("axis,tile2d", [(1, False), (0, False), (1, True)], ids=["rows", "cols", "128x128"])
def test_gpu_fp8_block_quantize_equals_reference(monkeypatch, dtype, axis, tile2d):
    """Hopper's FP8-block quantizer (one Triton kernel; RNE by the GPU's E4M3 conversion) byte for byte."""
    x = edge_tensor(768, 1536).to(dtype)
    got, want = gpu_and_ref(monkeypatch, lambda t: dispatch.quantize(t, "fp8_block", axis, tile2d=tile2d), x)
    assert_same(got, want)
