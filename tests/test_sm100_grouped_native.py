"""The sm_100 native grouped path: the arguments ``scaled_grouped_mm_native`` gives
``torch.nn.functional.scaled_grouped_mm`` (experts' fprop and dgrad, 2d x 3d; wgrad, 2d x 2d), checked against
torch's contract for the grouped block-scaled kernels (E4M3 or packed FP4 codes, A row-major and B
column-major, each group's scales swizzled and padded, in buffers sized for any group sizes, one NVFP4 tensor
scale per group, int32 offsets, bf16 output) by a stand-in that decodes them, with nothing read on the host;
and which path ``grouped_gemm_path`` picks, with its reasons."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes

from autoprec.kernels.core.operand import as_operand
from autoprec.kernels.dispatch import dense as dispatch
from autoprec.kernels.dispatch import grouped as grouped_dispatch
from autoprec.kernels.dispatch.grouped_mm import grouped_mm
from autoprec.kernels.dispatch.grouped_route import grouped_route
from autoprec.kernels.reference.hadamard import rht_signs
from autoprec.kernels.triton.quantize_rows import rht_operand

from helpers import decode_swizzled, stand_in_gpu
from test_no_host_sync import HostReads

calls: list[torch.dtype] = []


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def fake_scaled_grouped_mm(*args, **kwargs) -> torch.Tensor:
    """``torch.nn.functional.scaled_grouped_mm``'s stand-in (``contract_product``), run out of sight of a
    ``HostReads`` around it: it reads the offsets on the host, which the real kernel does not."""
    with _disable_current_modes():
        return contract_product(*args, **kwargs)


def contract_product(mat_a, mat_b, scale_a, recipe_a, scale_b, recipe_b, swizzle_a=None, swizzle_b=None, bias=None,
                     offs=None, output_dtype=torch.bfloat16, contraction_dim=(), use_fast_accum=False):
    """The 2d x 3d and 2d x 2d grouped block-scaled GEMMs as torch's contract describes them, decoded in
    float64."""
    calls.append(mat_a.dtype)
    nvfp4 = mat_a.dtype == torch.float4_e2m1fn_x2
    assert mat_a.dtype == mat_b.dtype and mat_a.dtype in (torch.float8_e4m3fn, torch.float4_e2m1fn_x2)
    assert mat_a.ndim == 2 and mat_a.stride(1) == 1 and mat_a.stride(0) % 16 == 0, "A row-major, 16-byte rows"
    assert mat_b.stride(-2) == 1 and mat_b.stride(-1) % 16 == 0, "B column-major, 16-byte columns"
    assert bias is None and output_dtype == torch.bfloat16 and not use_fast_accum and contraction_dim == ()
    assert offs.dtype == torch.int32 and offs.ndim == 1
    groups, n = offs.shape[0], mat_b.shape[-1]
    alpha = torch.ones(groups, dtype=torch.float64)
    if nvfp4:
        assert recipe_a == recipe_b == [F.ScalingType.BlockWise1x16, F.ScalingType.TensorWise]
        assert swizzle_a == swizzle_b == [F.SwizzleType.SWIZZLE_32_4_4, F.SwizzleType.NO_SWIZZLE]
        for s in (scale_a, scale_b):
            assert s[0].dtype == torch.float8_e4m3fn
            assert s[1].dtype == torch.float32 and s[1].shape == (groups,) and s[1].is_contiguous()
        alpha = scale_a[1].double() * scale_b[1].double()
        scale_a, scale_b, block = scale_a[0], scale_b[0], 16
    else:
        assert recipe_a == recipe_b == F.ScalingType.BlockWise1x32
        assert swizzle_a == swizzle_b == F.SwizzleType.SWIZZLE_32_4_4
        assert scale_a.dtype == scale_b.dtype == torch.float8_e8m0fnu
        block = 32
    assert scale_a.ndim == 2 and scale_a.is_contiguous() and scale_b.is_contiguous()
    pack = 2 if nvfp4 else 1
    ends = offs.tolist()
    bounds = list(zip([0] + ends[:-1], ends))
    if mat_b.ndim == 3:  # 2d x 3d: groups of A's rows, one expert weight each
        assert mat_b.shape == (groups, mat_a.shape[1], n) and ends[-1] <= mat_a.shape[0]
        cols = round_up(mat_a.shape[1] * pack // block, 4)
        padded = [round_up(e - s, 128) for s, e in bounds]
        # rows for any group sizes (torchao sizes them so): each group's from the sum of the padded ones before it
        assert scale_a.shape[0] >= sum(padded) and scale_a.shape[1] == cols
        assert scale_b.shape == (groups, round_up(n, 128) * cols)
        out = torch.full((mat_a.shape[0], n), float("nan"), dtype=torch.float64)  # rows in no group: not said
        first = 0
        for g, (s, e) in enumerate(bounds):
            if e > s:
                a = decode_swizzled(mat_a[s:e], scale_a[first:first + padded[g]].flatten(), block)
                out[s:e] = a @ decode_swizzled(mat_b[g].t(), scale_b[g], block).t() * alpha[g]
            first += padded[g]
        return out.bfloat16()
    # 2d x 2d: groups along the reduction, each group's scales one swizzled chunk after the other
    m = mat_a.shape[0]
    assert mat_b.ndim == 2 and mat_a.shape[1] == mat_b.shape[0] and ends[-1] * 1 == mat_a.shape[1] * pack
    assert all((e - s) % 32 == 0 for s, e in bounds)
    chunks = [round_up((e - s) // block, 4) for s, e in bounds]
    assert scale_a.shape == (round_up(m, 128), sum(chunks)) and scale_b.shape == (round_up(n, 128), sum(chunks))
    out = torch.full((groups, m, n), float("nan"), dtype=torch.float64)  # what an empty group gets is not said
    flat_a, flat_b, first = scale_a.flatten(), scale_b.flatten(), 0
    for g, (s, e) in enumerate(bounds):
        if e > s:
            a = decode_swizzled(mat_a[:, s // pack:e // pack], flat_a[first * scale_a.shape[0]:
                                                                     (first + chunks[g]) * scale_a.shape[0]], block)
            b = decode_swizzled(mat_b[s // pack:e // pack].t(), flat_b[first * scale_b.shape[0]:
                                                                       (first + chunks[g]) * scale_b.shape[0]], block)
            out[g] = a @ b.t() * alpha[g]
        first += chunks[g]
    return out.bfloat16()


CASES = {  # format, rounding of a, 16x16 weight tiles, RHT
    "nvfp4-fprop": ("nvfp4", "rne", False, False),
    "nvfp4-16x16-weight": ("nvfp4", "rne", True, False),
    "nvfp4-dgrad-sr-rht": ("nvfp4", "sr", False, True),
    "mxfp8-fprop": ("mxfp8", "rne", False, False),
    "mxfp8-dgrad-sr": ("mxfp8", "sr", False, False),
}
SIZES = [5, 0, 130, 37, 22]  # an empty expert, one past a 128-row scale tile, groups of odd sizes
WGRAD_SIZES = [64, 0, 160, 5, 37]  # groups of any size: each padded to a multiple of 128 tokens


def offsets(sizes: list[int]) -> torch.Tensor:
    return torch.tensor(sizes).cumsum(0).to(torch.int32)


def as_sm100(monkeypatch) -> None:
    """Dispatch as on an sm_100 GPU: its capability stood in for, Triton's kernels run (in the interpreter)."""
    stand_in_gpu(monkeypatch, (10, 0))


def native_and_loop(monkeypatch, a, b, offs, fmt, **args):
    """grouped_mm on the CPU (the per-group loop), then as an sm_100 device runs it (the stand-in; Triton's
    quantizers in the interpreter), reading nothing on the host."""
    want = grouped_mm(a, b, offs, fmt, **args)
    as_sm100(monkeypatch)
    monkeypatch.setattr(F, "scaled_grouped_mm", fake_scaled_grouped_mm)
    calls.clear()
    if args.get("rht"):  # the sign vector's one copy to the device (cached per vector) is made before the check
        rht_operand(a, True, args.get("rht_signs"))
    with HostReads() as rec:
        got = grouped_mm(a, b, offs, fmt, **args)
    assert rec.found == []
    assert len(calls) == 1, "one native grouped call for every expert"
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    return got, want


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to accumulation order and bf16's rounding, at each group's own scale."""
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-3 * float(want.float().abs().max()))


@pytest.mark.parametrize("case", list(CASES))
def test_sm100_native_grouped_fprop_follows_torch_contract_and_matches_the_per_group_loop(monkeypatch, case):
    """2d x 3d with experts of very different magnitudes (per-group NVFP4 tensor scales), an empty expert, a
    group across two scale tiles and rows past the last offset."""
    fmt, rounding, tiles, rht = CASES[case]
    gen = torch.Generator().manual_seed(3)
    offs = offsets(SIZES)
    a, w = torch.randn(int(offs[-1]) + 3, 64, generator=gen), torch.randn(5, 64, 48, generator=gen) * 0.02
    w[3] *= 1000.0
    got, want = native_and_loop(monkeypatch, a, w, offs, fmt, rounding_a=rounding, tile2d_b=tiles, rht=rht,
                                rht_signs=rht_signs(0), seeds=(4, 5), step=2, out_dtype=torch.bfloat16)
    assert torch.equal(got[int(offs[-1]):], torch.zeros(3, 48, dtype=torch.bfloat16))
    for s, e in zip([0] + offs.tolist()[:-1], offs.tolist()):
        if e > s:
            close(got[s:e], want[s:e])


@pytest.mark.parametrize("fmt,rounding", [("nvfp4", "sr"), ("mxfp8", "rne"), ("mxfp8", "sr")])
def test_sm100_native_grouped_wgrad_follows_torch_contract_and_matches_the_per_group_loop(monkeypatch, fmt,
                                                                                          rounding):
    """2d x 2d (groups along the tokens, the reduction, of any size): SR on both operands and RHT as wgrad runs
    them, an empty expert's gradient zero, one group 1000x larger than the others."""
    gen = torch.Generator().manual_seed(8)
    offs = offsets(WGRAD_SIZES)
    x, dy = torch.randn(80, int(offs[-1]) + 32, generator=gen), torch.randn(int(offs[-1]) + 32, 48, generator=gen)
    dy[64:224] *= 1000.0
    got, want = native_and_loop(monkeypatch, x, dy, offs, fmt, rounding_a=rounding, rounding_b=rounding,
                                rht=fmt == "nvfp4", rht_signs=rht_signs(0), seeds=(6, 7), step=1,
                                out_dtype=torch.bfloat16)
    assert torch.equal(got[1], torch.zeros(80, 48, dtype=torch.bfloat16))
    for g in (0, 2, 3, 4):
        close(got[g], want[g])


@pytest.mark.parametrize("fmt,out_dtype", [("mxfp8_e5m2", torch.bfloat16), ("nvfp4", torch.float32)],
                         ids=["e5m2", "fp32-out"])
def test_sm100_wgrad_the_native_gemm_refuses_runs_one_launch(monkeypatch, fmt, out_dtype):
    """On sm_100 (stood in for; Triton in the interpreter) a wgrad the native grouped GEMM does not take (E5M2, an
    fp32 output) runs the one-launch K-grouped path (two quantizations, one Triton GEMM), not a quantization and a
    GEMM per group; it matches the per-group loop."""
    gen = torch.Generator().manual_seed(9)
    sizes = [5, 0, 40, 37]
    offs = offsets(sizes)
    x, dy = torch.randn(48, int(offs[-1]) + 4, generator=gen), torch.randn(int(offs[-1]) + 4, 32, generator=gen)
    args = dict(rounding_a="sr", rounding_b="sr", rht=fmt == "nvfp4", rht_signs=rht_signs(0), seeds=(6, 7), step=1,
                out_dtype=out_dtype)
    want = grouped_mm(x, dy, offs, fmt, **args)
    as_sm100(monkeypatch)
    monkeypatch.setattr(F, "scaled_grouped_mm", lambda *a, **k: pytest.fail("the native grouped GEMM"))
    monkeypatch.setattr(dispatch, "quantize", lambda *a, **k: pytest.fail("a quantization per group"))
    got = grouped_mm(x, dy, offs, fmt, **args)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    for g in range(len(sizes)):
        close(got[g], want[g])


@pytest.mark.parametrize("fmt,out_dtype,path", [
    ("nvfp4", torch.bfloat16, "native_grouped"), ("mxfp8", torch.bfloat16, "native_grouped"),
    ("mxfp8", torch.float32, "decoded_grouped"), ("mxfp8_e5m2", torch.bfloat16, "decoded_grouped"),
    ("mxfp8", torch.float16, "decoded_grouped")])
def test_sm100_wgrad_path_is_chosen_before_quantizing(monkeypatch, fmt, out_dtype, path):
    """sm_100's wgrad path, chosen from formats and shapes alone (K-grouped groups are whole multiples of 128
    tokens, whatever their sizes): native where the native GEMM takes the product, else the one launch (an fp16
    output as its fp32 product, rounded once)."""
    as_sm100(monkeypatch)
    route = grouped_route(torch.device("cpu"), "2d2d", fmt, (torch.float32, torch.float32), ((48, 70), (70, 32)), 4,
                          False, out_dtype)
    assert (route.kind, route.path) == ("wgrad", path)


def operands(fa: str = "nvfp4", fb: str = "nvfp4", n: int = 48, k: int = 64):
    """One group's operands: (32, k) tokens and a (k, n) weight."""
    a = as_operand(dispatch.quantize(torch.randn(32, k), fa, 1), 1, "a")
    b = as_operand(dispatch.quantize(torch.randn(k, n), fb, 0), 0, "b")
    return a, b


@pytest.mark.parametrize("capability,layout,ops,out_dtype,path,why", [
    (None, "2d3d", ("nvfp4", "nvfp4"), torch.bfloat16, "triton_grouped", "the Triton interpreter"),
    (None, "2d2d", ("nvfp4", "nvfp4"), torch.bfloat16, "triton_grouped", "the Triton interpreter"),
    (None, "3d3d", ("nvfp4", "nvfp4"), torch.bfloat16, "per_group", "layout 3d3d"),
    ((9, 0), "2d3d", ("nvfp4", "nvfp4"), torch.bfloat16, "decoded_grouped", "sm_90"),
    ((9, 0), "2d3d", ("nvfp4", "nvfp4"), torch.float16, "per_group", "out_dtype torch.float16"),
    ((9, 0), "2d2d", ("mxfp8", "mxfp8"), torch.bfloat16, "decoded_grouped", "sm_90"),
    ((10, 0), "3d3d", ("nvfp4", "nvfp4"), torch.bfloat16, "per_group", "layout 3d3d"),
    ((10, 0), "2d2d", ("mxfp8", "mxfp8_e5m2"), torch.bfloat16, "decoded_grouped", "E5M2"),
    ((10, 0), "2d3d", ("nvfp4", "nvfp4"), torch.float32, "decoded_grouped", "writes bfloat16"),
    ((10, 0), "2d3d", ("mxfp8", "mxfp8_e5m2"), torch.bfloat16, "decoded_grouped", "E5M2"),
    ((10, 0), "2d3d", ("nvfp4", "mxfp8"), torch.bfloat16, "decoded_grouped", "nvfp4 times mxfp8"),
    ((12, 0), "2d3d", ("nvfp4", "nvfp4"), torch.bfloat16, "decoded_grouped", "sm_100 only"),  # RTX 50x0 / PRO 6000
    ((12, 1), "2d2d", ("mxfp8", "mxfp8"), torch.bfloat16, "decoded_grouped", "sm_100 only"),  # GB10
    ((11, 0), "2d3d", ("mxfp8", "mxfp8"), torch.bfloat16, "decoded_grouped", "sm_100 only"),
])
def test_sm100_grouped_gemm_path_names_why_not_native(capability, layout, ops, out_dtype, path, why):
    """Where the native grouped GEMM does not run: one Triton launch (bf16 or fp32 out) for 2d x 3d and 2d x 2d,
    the rest per group; the reason names what kept it from the native path."""
    got, reason = grouped_dispatch.grouped_gemm_path(capability, layout, *operands(*ops), out_dtype, 8)
    assert got == path and why in reason


def test_sm100_grouped_gemm_path_picks_native_and_respects_forced_kernels(monkeypatch):
    bf16 = torch.bfloat16
    path = grouped_dispatch.grouped_gemm_path
    assert path((10, 0), "2d3d", *operands(), bf16, 8) == ("native_grouped", None)
    assert path((10, 0), "2d2d", *operands("mxfp8", "mxfp8"), bf16, 8) == ("native_grouped", None)
    assert path((10, 3), "2d3d", *operands(), bf16, 8) == ("native_grouped", None)  # B300
    bad_k = path((10, 0), "2d3d", *operands(k=48), bf16, 8)
    assert bad_k[0] == "decoded_grouped" and "K=48" in bad_k[1]
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    assert path((10, 0), "2d3d", *operands(), bf16, 8) == ("triton_grouped", "AUTOPREC_KERNELS=triton")
    assert path((10, 0), "2d2d", *operands(), bf16, 8) == ("triton_grouped", "AUTOPREC_KERNELS=triton")


def test_sm100_paths_need_torch_native_api(monkeypatch):
    """A torch without the native functions (older releases) runs per group, and the dense GEMM decoded,
    saying why."""
    monkeypatch.delattr(F, "scaled_grouped_mm")
    monkeypatch.delattr(F, "scaled_mm")
    path, why = grouped_dispatch.grouped_gemm_path((10, 0), "2d3d", *operands(), torch.bfloat16, 8)
    assert path == "decoded_grouped" and "no torch.nn.functional.scaled_grouped_mm" in why
    path, why = dispatch.gemm_path((10, 0), *operands())
    assert path == "decoded" and "no torch.nn.functional.scaled_mm" in why
