"""The experts' wgrad (2d x 2d, token groups along the reduction) without host reads, in the interpreter: the
K-grouped quantizer (kernels/triton/quantize_k_groups.py) writes, group by group, the bytes of quantizing each
zero-padded group alone; the one-launch wgrad GEMM equals each group's dense reference GEMM (fp32 accumulation
order), an empty group's gradient is zero; the decoded (sm_90) path reads nothing on the host; grouped_mm runs
it for 2d x 2d."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from autoprec.formats import get_format
from autoprec.kernels import quantize_ref, rht_ref
from autoprec.kernels.core.operand import Operand
from autoprec.kernels.core.random_bits import group_seed, sr_bits, sr_stream
from autoprec.kernels.dispatch import dense as dispatch
from autoprec.kernels.dispatch.grouped_mm import grouped_mm
from autoprec.kernels.triton import quantize_k_groups as k_groups
from autoprec.kernels.triton.grouped_mm import grouped_wgrad_decoded, grouped_wgrad_tc_triton
from autoprec.kernels.triton.quantize_k_groups import GROUP_PAD, quantize_k_groups_triton

from helpers import bits_equal, edge_tensor, force_tile, pairwise, record_runs, tile_id, tile_sweep
from test_no_host_sync import HostReads

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
STEP = 3
ENDS = [5, 5, 150, 160, 291]  # a group of 5 tokens, an empty one, one past GROUP_PAD, tokens past the last end
T, M, N = 300, 48, 32


def reference_groups(x, fmt, axis, seed, rht):
    """Each group of tokens (along ``axis``) zero-padded to whole blocks and quantized alone; None if empty."""
    block, out, start = get_format(fmt).block_size, [], 0
    for g, end in enumerate(ENDS):
        part = x[:, start:end] if axis == 1 else x[start:end]
        pad = -part.shape[axis] % block
        part = F.pad(part, (0, pad) if axis == 1 else (0, 0, 0, pad))
        if end > start:
            src = rht_ref(part, axis) if rht else part
            rand = None if seed is None else sr_bits(part.shape, sr_stream(group_seed(seed, g), STEP))
            out.append(quantize_ref(src, fmt, axis, rounding="rne" if seed is None else "sr", rand=rand))
        else:
            out.append(None)
        start = end
    return out


@pytest.mark.parametrize(("fmt", "axis", "seed", "rht"), pairwise(
    {f: f for f in ("nvfp4", "mxfp8", "mxfp8_e5m2")}, {"left_MxT": 1, "right_TxN": 0}, {"rne": None, "sr": 2**31 + 7},
    {"plain": False, "rht": True}))
def test_k_grouped_quantizer_equals_each_padded_group_alone(fmt, axis, seed, rht):
    """The left operand as it lies reads its tokens along the unit-stride dim (the tile kernels), the right one down
    a strided dim (the slice kernels)."""
    check_k_grouped(fmt, axis, seed, rht)


@pytest.mark.parametrize("config", tile_sweep(k_groups.NVFP4_CONFIGS))
def test_every_k_grouped_tile_matches_reference(monkeypatch, config):
    """Each tile a GPU may pick for the K-grouped tile kernels (the interpreter runs the first alone): the left
    operand, whose tokens they read (the right one's take the slice kernels, below), SR with the RHT; on a GPU,
    MXFP8 only at the tiles it is tuned over."""
    force_tile(monkeypatch, (k_groups._nvfp4_k_groups_kernel, k_groups._mxfp8_k_groups_kernel), config)
    for fmt in ("nvfp4", "mxfp8") if DEVICE == "cpu" or config in k_groups.MXFP8_CONFIGS else ("nvfp4",):
        check_k_grouped(fmt, 1, 2**31 + 7, True)


@pytest.mark.slow
@pytest.mark.parametrize("config", k_groups.qc.NVFP4_CONFIGS + k_groups.qc.MXFP8_CONFIGS, ids=tile_id)
def test_every_k_grouped_slice_tile_matches_reference(monkeypatch, config):
    """Tokens read down a strided dim (the right operand (T, N) as it lies) take the slice kernels: each of their
    GPU tiles forced, SR with the RHT (slow: the interpreter runs these narrow tiles 4x slower than its own; the
    default run checks its own tile, and test_gpu_quantize.py forces the dense slice kernels' on a GPU)."""
    kernels = (k_groups._nvfp4_k_groups_cols_kernel, k_groups._mxfp8_k_groups_cols_kernel)
    force_tile(monkeypatch, kernels, config)
    check_k_grouped("nvfp4" if config in k_groups.qc.NVFP4_CONFIGS else "mxfp8", 0, 2**31 + 7, True)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_transposed_operands_swap_tile_and_slice_kernels(monkeypatch, fmt):
    """A left operand (M, T) that is a transposed view reads its tokens down a strided dim (the slice kernels), a
    right one (T, N) that is one along the unit-stride dim (the tile kernels): each equals its groups alone."""
    ran = []
    record_runs(monkeypatch, (("slices", k_groups._nvfp4_k_groups_cols_kernel),
                              ("tiles", k_groups._nvfp4_k_groups_kernel),
                              ("slices", k_groups._mxfp8_k_groups_cols_kernel),
                              ("tiles", k_groups._mxfp8_k_groups_kernel)), ran)
    for axis in (1, 0):
        check_k_grouped(fmt, axis, 2**31 + 7, True, transposed=True)
    assert ran == ["slices", "tiles"]


def check_k_grouped(fmt: str, axis: int, seed: int | None, rht: bool, transposed: bool = False) -> None:
    """The K-grouped quantization of an edge tensor (groups 1000x apart) equals each group padded and quantized
    alone, padding zero, its padded ends as expected. ``transposed``: the operand is a transposed view (tokens down
    a strided dim for the left operand, along the unit-stride one for the right)."""
    x = edge_tensor(M, T) if axis == 1 else edge_tensor(N, T).t().contiguous()  # edge blocks along the tokens
    spread = torch.tensor([1000.0 ** (i % 3 - 1) for i in range(T)])  # groups 1000x apart: own tensor scales
    x = x * (spread[None, :] if axis == 1 else spread[:, None])
    if transposed:
        x = x.t().contiguous().t()
    f, offs = get_format(fmt), torch.tensor(ENDS, dtype=torch.int32, device=DEVICE)
    codes, scales, ts, ends = quantize_k_groups_triton(x.to(DEVICE), f, axis, offs, seed=seed,
                                                       step=torch.tensor(STEP, device=DEVICE), rht=rht)
    pack = 2 if fmt == "nvfp4" else 1
    col, expected_ends = 0, []
    for g, ref in enumerate(reference_groups(x, fmt, axis, seed, rht)):
        width = 0 if ref is None else -(-ref.codes.shape[1] * pack // GROUP_PAD) * GROUP_PAD
        if ref is not None:
            lp = ref.codes.shape[1] * pack  # the group's tokens padded to whole blocks
            c, s = codes[:, col // pack:(col + width) // pack].cpu(), scales[:, col // f.block_size:
                                                                        (col + width) // f.block_size].cpu()
            assert bits_equal(c[:, :lp // pack], ref.codes) and bits_equal(s[:, :lp // f.block_size], ref.scales), g
            assert not c[:, lp // pack:].view(torch.uint8).any() and not s[:, lp // f.block_size:].view(
                torch.uint8).any(), f"group {g}: padding past its blocks is zero"
            if ts is not None:
                assert bits_equal(ts[g].cpu(), ref.tensor_scale), g
        elif ts is not None:
            assert ts[g].item() == 1.0
        col += width
        expected_ends.append(col)
    assert ends.cpu().tolist() == expected_ends
    assert not codes[:, col // pack:].cpu().view(torch.uint8).any(), "columns past the last group are zero"


def quantized_operands(fmt, x, dy, offs, step):
    """The wgrad's two K-grouped operands (SR on both, the RHT for NVFP4, as a wgrad runs) as the kernels' Operands,
    their per-group tensor scales, and the padded ends."""
    f, rht = get_format(fmt), fmt == "nvfp4"
    ops = []
    for src, axis, seed in ((x, 1, 6), (dy, 0, 7)):
        codes, scales, ts, ends = quantize_k_groups_triton(src, f, axis, offs, seed=seed, step=step, rht=rht)
        ops.append(Operand(f, codes, scales, ts, codes.shape[0], codes.shape[1] * (2 if fmt == "nvfp4" else 1)))
    return ops, ends


@pytest.mark.parametrize(("fmt", "run", "out_dtype"), pairwise(
    {"nvfp4": "nvfp4", "mxfp8": "mxfp8"},
    {"sm90_decoded": grouped_wgrad_decoded, "sm90_in_register": grouped_wgrad_tc_triton},
    {"fp32": torch.float32, "bf16": torch.bfloat16}))
def test_sm90_grouped_wgrad_equals_each_groups_dense_gemm(monkeypatch, fmt, run, out_dtype):
    gen = torch.Generator().manual_seed(1)
    x, dy = torch.randn(M, T, generator=gen), torch.randn(T, N, generator=gen)
    dy[150:160] *= 1000.0
    offs = torch.tensor(ENDS, dtype=torch.int32, device=DEVICE)
    (a, b), ends = quantized_operands(fmt, x.to(DEVICE), dy.to(DEVICE), offs, torch.tensor(STEP, device=DEVICE))
    got = run(a, b, ends, out_dtype).cpu()
    assert got.shape == (len(ENDS), M, N) and got.dtype == out_dtype
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    want = grouped_mm(x, dy, offs.cpu(), fmt, rounding_a="sr", rounding_b="sr", rht=fmt == "nvfp4", seeds=(6, 7),
                      step=STEP, out_dtype=torch.float32)
    tol = 2**-8 if out_dtype == torch.bfloat16 else 1e-5
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    for g in (0, 2, 3, 4):
        torch.testing.assert_close(got[g].float(), want[g], rtol=tol, atol=tol * want[g].abs().max().item())


def test_sm90_grouped_wgrad_recomputes_values_bf16_does_not_hold(monkeypatch):
    """MXFP8 activations near 2**-128 decode to values below bf16's normal range: the decode flags them on the device
    and the guarded fp32 kernel's persistent grid (4 programs in the interpreter) recomputes all 10 tiles of the 5
    groups' products; they equal the reference."""
    gen = torch.Generator().manual_seed(3)
    x, dy = torch.randn(M, T, generator=gen) * 2.0**-128, torch.randn(T, N, generator=gen)
    offs = torch.tensor(ENDS, dtype=torch.int32, device=DEVICE)
    (a, b), ends = quantized_operands("mxfp8", x.to(DEVICE), dy.to(DEVICE), offs, torch.tensor(STEP, device=DEVICE))
    got = grouped_wgrad_decoded(a, b, ends, torch.float32).cpu()
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    want = grouped_mm(x, dy, offs.cpu(), "mxfp8", rounding_a="sr", rounding_b="sr", seeds=(6, 7), step=STEP,
                      out_dtype=torch.float32)
    assert all(want[g].abs().max() > 0 for g in (0, 2, 3, 4))
    for g in range(len(ENDS)):
        torch.testing.assert_close(got[g], want[g], rtol=1e-5, atol=1e-5 * want[g].abs().max().item())


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_sm90_grouped_wgrad_reads_nothing_on_the_host(fmt):
    """On fewer tokens than the tests above (an empty group, tokens past the last end): the interpreter's cost."""
    gen, group_ends = torch.Generator().manual_seed(2), [5, 5, 40]
    x, dy = torch.randn(M, 48, generator=gen).to(DEVICE), torch.randn(48, N, generator=gen).to(DEVICE)
    offs, step = torch.tensor(group_ends, dtype=torch.int32).to(DEVICE), torch.tensor(STEP).to(DEVICE)
    (a, b), ends = quantized_operands(fmt, x, dy, offs, step)
    grouped_wgrad_decoded(a, b, ends, torch.bfloat16)  # compiled outside the check
    with HostReads() as rec:
        (a, b), ends = quantized_operands(fmt, x, dy, offs, step)
        grouped_wgrad_decoded(a, b, ends, torch.bfloat16)
    assert rec.found == []


def test_grouped_mm_runs_the_wgrad_in_one_launch_in_the_interpreter(monkeypatch):
    """A quantized 2d x 2d grouped_mm under AUTOPREC_KERNELS=triton: no per-group quantization or dense GEMM, and
    the product of auto mode's per-group CPU kernels."""
    gen = torch.Generator().manual_seed(3)
    x, dy = torch.randn(M, T, generator=gen), torch.randn(T, N, generator=gen)
    offs = torch.tensor(ENDS, dtype=torch.int32)
    opts = dict(rounding_a="sr", rounding_b="sr", rht=True, seeds=(1, 2), step=torch.tensor(4),
                out_dtype=torch.float32)
    expected = grouped_mm(x, dy, offs, "nvfp4", **opts)
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    monkeypatch.setattr(dispatch, "scaled_mm", lambda *args: pytest.fail("a dense GEMM per group"))
    monkeypatch.setattr(dispatch, "quantize", lambda *args, **kwargs: pytest.fail("a quantization per group"))
    torch.testing.assert_close(grouped_mm(x, dy, offs, "nvfp4", **opts), expected, rtol=1e-5, atol=1e-4)
