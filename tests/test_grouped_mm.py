"""Grouped (experts) GEMMs: exact mode matches aten._grouped_mm; quantized mode is bit-exact with an
oracle that quantizes every group on its own with the reference quantizers (zero-padded wgrad groups,
one NVFP4 tensor scale per group, per-group SR streams)."""
import pytest
import torch
import torch.nn.functional as F

import autoprec.kernels.ops  # noqa: F401
from autoprec.formats import get_format
from autoprec.kernels.core.random_bits import group_seed, sr_bits, sr_stream
from autoprec.kernels.dispatch.grouped_mm import grouped_mm
from autoprec.kernels.reference.hadamard import rht_ref, rht_signs
from autoprec.kernels.reference.quantize import dequantize_ref, quantize_ref

SIZES = [5, 0, 16, 37, 22]  # an empty expert, groups that are not whole blocks
OFFS = torch.tensor(SIZES, dtype=torch.int32).cumsum(0).to(torch.int32)
T = int(OFFS[-1])


def data(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def test_exact_matches_aten_grouped_mm():
    a, w = data(T, 32).bfloat16(), data(5, 32, 48, seed=1).bfloat16()
    ref = F.grouped_mm(a, w, offs=OFFS)
    assert torch.allclose(grouped_mm(a.float(), w.float(), OFFS), ref.float(), rtol=2e-2, atol=2e-2)
    g = data(T, 48, seed=2).bfloat16()
    wgrad = torch._grouped_mm(a.t(), g, OFFS)
    assert torch.allclose(grouped_mm(a.float().t(), g.float(), OFFS), wgrad.float(), rtol=2e-2, atol=5e-2)


def _oracle_group(ag, bg, fmt, rounding_a, rounding_b, tile2d, rht, seeds, g, step, block):
    """One group quantized by hand: zero-padded reduction, reference quantizers, explicit SR bits."""
    pad = -ag.shape[1] % block
    ag, bg = F.pad(ag, (0, pad)), F.pad(bg, (0, 0, 0, pad))
    if rht:
        ag, bg = rht_ref(ag, 1, rht_signs(0)), rht_ref(bg, 0, rht_signs(0))
    vals = []
    for x, axis, rounding, seed, t2 in ((ag, 1, rounding_a, seeds[0], False), (bg, 0, rounding_b, seeds[1], tile2d)):
        rand = sr_bits(x.shape, sr_stream(group_seed(seed, g), step)) if rounding == "sr" else None
        q = quantize_ref(x, fmt, axis, rounding=rounding, rand=rand, tile2d=t2)
        vals.append(dequantize_ref(q))
    return vals[0] @ vals[1]


CASES = [("nvfp4", "rne", "rne", False, False), ("nvfp4", "rne", "sr", False, True),
         ("nvfp4", "rne", "rne", True, False), ("nvfp4", "sr", "rne", True, False),
         ("mxfp8", "rne", "rne", False, False), ("mxfp8", "sr", "rne", False, False),
         ("mxfp8_e5m2", "rne", "sr", False, False)]


@pytest.mark.parametrize("k", [64, 40], ids=["k64", "k40-padded"])
@pytest.mark.parametrize("fmt,ra,rb,tile2d,rht", CASES)
def test_fprop_layout_bit_exact(fmt, ra, rb, tile2d, rht, k):
    """2d x 3d (fprop / dgrad): each expert's tokens and weight quantized on their own (a reduction that is not
    whole blocks zero-padded, as each group alone pads it)."""
    a, w = data(T, k), data(5, k, 32, seed=1)
    w[3] *= 1000.0  # experts of very different magnitudes: per-expert tensor scales keep both
    got = grouped_mm(a, w, OFFS, fmt, rounding_a=ra, rounding_b=rb, tile2d_b=tile2d, rht=rht,
                     rht_signs=rht_signs(0), seeds=(11, 12), step=3)
    want = torch.zeros(T, 32)
    for g, (s, e) in enumerate(zip([0] + OFFS.tolist()[:-1], OFFS.tolist())):
        if e > s:
            want[s:e] = _oracle_group(a[s:e], w[g], fmt, ra, rb, tile2d, rht, (11, 12), g, 3,
                                      get_format(fmt).block_size)
    assert torch.equal(got, want)


@pytest.mark.parametrize("fmt,ra,rb,tile2d,rht", [c for c in CASES if not c[3]])
def test_wgrad_layout_bit_exact_with_padding(fmt, ra, rb, tile2d, rht):
    """2d x 2d (wgrad): groups along the reduction, zero-padded to whole blocks inside the quantizer."""
    x, dy = data(48, T), data(T, 32, seed=1)
    got = grouped_mm(x, dy, OFFS, fmt, rounding_a=ra, rounding_b=rb, rht=rht, rht_signs=rht_signs(0),
                     seeds=(5, 6), step=1)
    block = 16 if fmt == "nvfp4" else 32
    want = torch.zeros(5, 48, 32)
    for g, (s, e) in enumerate(zip([0] + OFFS.tolist()[:-1], OFFS.tolist())):
        if e > s:
            want[g] = _oracle_group(x[:, s:e], dy[s:e], fmt, ra, rb, False, rht, (5, 6), g, 1, block)
    assert torch.equal(got, want)
    assert torch.equal(got[1], torch.zeros(48, 32))  # the empty expert gets a zero gradient


@pytest.mark.parametrize("k", [64, 40], ids=["k64", "k40-padded"])
@pytest.mark.parametrize("fmt,ra,rb,tile2d,rht", CASES)
def test_batched_layout_bit_exact(fmt, ra, rb, tile2d, rht, k):
    """3d x 3d (a batch of experts; its dgrad and wgrad are 3d x 3d too): item g's operands quantized on their own
    under group g's SR streams, as the 2d x 3d layout's token groups; a transposed view (a wgrad's a^T) as well."""
    a, w = data(4, 8, k), data(4, k, 32, seed=1)
    w[2] *= 1000.0
    for a_ in (a, a.transpose(1, 2).contiguous().transpose(1, 2)):
        got = grouped_mm(a_, w, None, fmt, rounding_a=ra, rounding_b=rb, tile2d_b=tile2d, rht=rht,
                         rht_signs=rht_signs(0), seeds=(11, 12), step=3)
        want = torch.stack([_oracle_group(a[g], w[g], fmt, ra, rb, tile2d, rht, (11, 12), g, 3,
                                          get_format(fmt).block_size)
                            for g in range(4)])
        assert torch.equal(got, want)


@pytest.mark.parametrize("k", [64, 40], ids=["k64", "k40-padded"])
def test_operands_are_quantized_where_they_lie(monkeypatch, k):
    """On the experts route the quantizers read the operands as stored, token rows, expert weights and a batch's
    items, row-major or stored transposed (a 3d x 3d wgrad's aᵀ), with no copy first, a reduction that is not
    whole blocks padded in the kernels (the bytes: ``test_fprop_layout_bit_exact``,
    ``test_batched_layout_bit_exact``)."""
    pytest.importorskip("triton")
    from autoprec.kernels.dispatch import grouped as grouped_dispatch

    seen = []
    for name in ("quantize_row_groups", "quantize_batches"):
        real = getattr(grouped_dispatch, name)
        monkeypatch.setattr(grouped_dispatch, name, lambda x, *args, _f=real, _n=name, **kwargs: seen.append(
            (_n, x.data_ptr(), kwargs.get("sr_of_transpose", False))) or _f(x, *args, **kwargs))
    tokens, w = data(T, k), data(5, k, 32, seed=1)
    grouped_mm(tokens, w, OFFS, "nvfp4", rounding_a="sr", step=3)
    stored, rows, items = data(4, k, 8), data(4, 8, k), data(4, k, 32, seed=1)
    grouped_mm(stored.transpose(1, 2), items, None, "nvfp4", rounding_a="sr", step=3)
    grouped_mm(rows, items, None, "nvfp4", rounding_a="sr", step=3)
    assert seen == [("quantize_row_groups", tokens.data_ptr(), False), ("quantize_batches", w.data_ptr(), False),
                    ("quantize_batches", stored.data_ptr(), True), ("quantize_batches", items.data_ptr(), False),
                    ("quantize_batches", rows.data_ptr(), True), ("quantize_batches", items.data_ptr(), False)]


@pytest.mark.parametrize("fmt", ["nvfp4", "bf16"])
def test_float16_output_is_the_fp32_product_rounded_once(fmt):
    """An fp16 model's grouped products: the kernels write fp32 or bf16, so fp16 is their fp32 product rounded
    once (never a bf16 product rounded again)."""
    a, w = data(T, 64), data(5, 64, 32, seed=1)
    got = grouped_mm(a, w, OFFS, fmt, seeds=(1, 2), out_dtype=torch.float16)
    assert got.dtype == torch.float16
    assert torch.equal(got, grouped_mm(a, w, OFFS, fmt, seeds=(1, 2), out_dtype=torch.float32).half())


def test_per_expert_tensor_scale_keeps_small_experts():
    """With one NVFP4 tensor scale per expert, a small expert beside a 1e4-larger one keeps its accuracy."""
    a, w = data(T, 64), data(5, 64, 32, seed=1)
    w[0] *= 1e-4
    got = grouped_mm(a, w, OFFS, "nvfp4")
    exact = a[:5] @ w[0]
    err = (got[:5] - exact).norm() / exact.norm()
    assert err < 0.15


def test_custom_op_and_step_change_sr_bits():
    a, w = data(T, 64), data(5, 64, 32, seed=1)
    args = ("nvfp4", "sr", "rne", False, False, 1, 2, "rceil", 0)
    y0 = torch.ops.autoprec.grouped_mm(a, w, OFFS, *args, torch.tensor(0), torch.float32)
    y1 = torch.ops.autoprec.grouped_mm(a, w, OFFS, *args, torch.tensor(1), torch.float32)
    assert y0.shape == (T, 32) and not torch.equal(y0, y1)
    assert torch.equal(y0, grouped_mm(a, w, OFFS, "nvfp4", rounding_a="sr", seeds=(1, 2), step=0))


def test_grouped_op_keeps_cuda_graphs_away():
    """The op reads its offsets on the host, so inductor's reduce-overhead mode must not capture it: it is the
    node that mode's check reports as incompatible."""
    from torch._inductor.utils import get_first_incompatible_cudagraph_node
    from torch.fx.experimental.proxy_tensor import make_fx

    args = ("nvfp4", "sr", "rne", False, False, 1, 2, "rceil", 0)
    gm = make_fx(lambda a, w, offs, step: torch.ops.autoprec.grouped_mm(a, w, offs, *args, step, torch.float32))(
        data(T, 64), data(5, 64, 32, seed=1), OFFS, torch.tensor(0))
    node = get_first_incompatible_cudagraph_node(gm)
    assert node is not None and node.target is torch.ops.autoprec.grouped_mm.default


def test_bad_offsets_and_layouts_raise():
    with pytest.raises(ValueError, match="non-decreasing"):
        grouped_mm(data(8, 16), data(2, 16, 16), torch.tensor([6, 4]))
    with pytest.raises(ValueError, match="not a supported layout"):
        grouped_mm(data(2, 8, 16), data(16, 16), torch.tensor([8, 16]))
