"""The sm_100 native grouped path: the arguments ``scaled_grouped_mm_native`` gives
``torch.nn.functional.scaled_grouped_mm`` (experts' fprop and dgrad, 2d x 3d), checked against torch's contract
for the grouped block-scaled kernels (E4M3 or packed FP4 codes, A row-major and B column-major, each group's
scales swizzled and padded to 128 rows, one NVFP4 tensor scale per group, int32 offsets, bf16 output) by a
stand-in that decodes them; and which path ``grouped_gemm_path`` picks, with its reasons."""
import pytest
import torch
import torch.nn.functional as F

from autoprec.kernels import dispatch
from autoprec.kernels.grouped import grouped_mm
from autoprec.kernels.hadamard_ref import rht_signs
from autoprec.kernels.operand import as_operand

from helpers import decode_swizzled

SIZES = [5, 0, 130, 37, 22]  # an empty expert, one past a 128-row scale tile, groups of odd sizes
OFFS = torch.tensor(SIZES).cumsum(0).to(torch.int32)
TOKENS = int(OFFS[-1]) + 3  # rows past the last offset come out zero


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def fake_scaled_grouped_mm(mat_a, mat_b, scale_a, recipe_a, scale_b, recipe_b, swizzle_a=None, swizzle_b=None,
                           bias=None, offs=None, output_dtype=torch.bfloat16, contraction_dim=(),
                           use_fast_accum=False):
    """The 2d x 3d grouped block-scaled GEMM as torch's contract describes it, decoded in float64."""
    calls.append(mat_a.dtype)
    nvfp4 = mat_a.dtype == torch.float4_e2m1fn_x2
    assert mat_a.dtype == mat_b.dtype and mat_a.dtype in (torch.float8_e4m3fn, torch.float4_e2m1fn_x2)
    assert mat_a.ndim == 2 and mat_a.stride(1) == 1 and mat_a.stride(0) % 16 == 0, "A row-major, 16-byte rows"
    assert mat_b.ndim == 3 and mat_b.stride(1) == 1 and mat_b.stride(2) % 16 == 0, "B column-major, 16-byte"
    assert mat_a.shape[1] == mat_b.shape[1]
    assert offs.dtype == torch.int32 and offs.shape == (mat_b.shape[0],)
    assert bias is None and output_dtype == torch.bfloat16 and not use_fast_accum and contraction_dim == ()
    groups, n = mat_b.shape[0], mat_b.shape[2]
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
    k = mat_a.shape[1] * (2 if nvfp4 else 1)
    cols = round_up(k // block, 4)
    ends = offs.tolist()
    starts = [0] + ends[:-1]
    padded = [round_up(e - s, 128) for s, e in zip(starts, ends)]
    assert scale_a.ndim == 2 and scale_a.is_contiguous() and scale_a.shape == (sum(padded), cols)
    assert scale_b.is_contiguous() and scale_b.shape == (groups, round_up(n, 128) * cols)
    assert ends[-1] <= mat_a.shape[0]
    out = torch.zeros(mat_a.shape[0], n, dtype=torch.float64)
    first = 0
    for g, (s, e) in enumerate(zip(starts, ends)):
        if e > s:
            a = decode_swizzled(mat_a[s:e], scale_a[first:first + padded[g]].flatten(), block)
            b = decode_swizzled(mat_b[g].t(), scale_b[g], block)
            out[s:e] = a @ b.t() * alpha[g]
        first += padded[g]
    return out.bfloat16()


calls: list[torch.dtype] = []

CASES = {  # format, rounding of a, 16x16 weight tiles, RHT
    "nvfp4-fprop": ("nvfp4", "rne", False, False),
    "nvfp4-16x16-weight": ("nvfp4", "rne", True, False),
    "nvfp4-dgrad-sr-rht": ("nvfp4", "sr", False, True),
    "mxfp8-fprop": ("mxfp8", "rne", False, False),
    "mxfp8-dgrad-sr": ("mxfp8", "sr", False, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sm100_native_grouped_arguments_follow_torch_contract_and_match_the_per_group_loop(monkeypatch, case):
    """Experts of very different magnitudes (per-group NVFP4 tensor scales), an empty expert, a group across
    two scale tiles: on an sm_100 device grouped_mm makes one native call, equal to the per-group loop up to
    accumulation order."""
    fmt, rounding, tiles, rht = CASES[case]
    gen = torch.Generator().manual_seed(3)
    a, w = torch.randn(TOKENS, 64, generator=gen), torch.randn(5, 64, 48, generator=gen) * 0.02
    w[3] *= 1000.0
    args = dict(rounding_a=rounding, tile2d_b=tiles, rht=rht, rht_signs=rht_signs(0), seeds=(4, 5), step=2,
                out_dtype=torch.bfloat16)
    want = grouped_mm(a, w, OFFS, fmt, **args)
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (10, 0))
    monkeypatch.setattr(F, "scaled_grouped_mm", fake_scaled_grouped_mm)
    calls.clear()
    got = grouped_mm(a, w, OFFS, fmt, **args)
    assert len(calls) == 1, "one native grouped call for every expert"
    assert got.dtype == torch.bfloat16 and got.shape == (TOKENS, 48)
    assert torch.equal(got[int(OFFS[-1]):], torch.zeros(3, 48, dtype=torch.bfloat16))
    for s, e in zip([0] + OFFS.tolist()[:-1], OFFS.tolist()):  # each expert to its own scale
        if e > s:
            torch.testing.assert_close(got[s:e].float(), want[s:e].float(), rtol=1e-2,
                                       atol=1e-3 * float(want[s:e].float().abs().max()))


def operands(fa: str = "nvfp4", fb: str = "nvfp4", n: int = 48, k: int = 64):
    a = as_operand(dispatch.quantize(torch.randn(32, k), fa, 1), 1, "a")
    b = as_operand(dispatch.quantize(torch.randn(k, n), fb, 0), 0, "b")
    return a, b


@pytest.mark.parametrize("capability,layout,ops,out_dtype,why", [
    (None, "2d3d", ("nvfp4", "nvfp4"), torch.bfloat16, "not an sm_100 or later GPU"),
    ((9, 0), "2d3d", ("nvfp4", "nvfp4"), torch.bfloat16, "sm_90"),
    ((10, 0), "2d2d", ("nvfp4", "nvfp4"), torch.bfloat16, "layout 2d2d"),
    ((10, 0), "2d3d", ("nvfp4", "nvfp4"), torch.float32, "writes bfloat16"),
    ((10, 0), "2d3d", ("mxfp8", "mxfp8_e5m2"), torch.bfloat16, "E5M2"),
    ((10, 0), "2d3d", ("nvfp4", "mxfp8"), torch.bfloat16, "nvfp4 times mxfp8"),
])
def test_sm100_grouped_gemm_path_names_why_it_runs_per_group(capability, layout, ops, out_dtype, why):
    path, reason = dispatch.grouped_gemm_path(capability, layout, *operands(*ops), out_dtype)
    assert path == "per_group" and why in reason


def test_sm100_grouped_gemm_path_picks_native_and_respects_forced_kernels(monkeypatch):
    assert dispatch.grouped_gemm_path((10, 0), "2d3d", *operands(), torch.bfloat16) == ("native_grouped", None)
    assert dispatch.grouped_gemm_path((10, 0), "2d3d", *operands("mxfp8", "mxfp8"), torch.bfloat16)[0] == \
        "native_grouped"
    bad_k = dispatch.grouped_gemm_path((10, 0), "2d3d", *operands(k=48), torch.bfloat16)
    assert bad_k[0] == "per_group" and "K=48" in bad_k[1]
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    assert dispatch.grouped_gemm_path((10, 0), "2d3d", *operands(), torch.bfloat16) == \
        ("per_group", "AUTOPREC_KERNELS=triton")
