"""Scale swizzling for Blackwell's block-scaled MMA, bit for bit against torchao's ``to_blocked`` and its MoE
group layouts."""
import pytest
import torch

from autoprec.kernels.cuda.swizzle import swizzle_scales

to_blocked = pytest.importorskip("torchao.prototype.mx_formats.utils").to_blocked


@pytest.mark.parametrize("shape", [(1, 1), (128, 4), (130, 5), (257, 9), (64, 12), (384, 16), (33, 3)])
def test_swizzle_matches_torchao_to_blocked(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    scales = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    assert torch.equal(swizzle_scales(scales), to_blocked(scales))
    e4m3 = torch.randn(shape, generator=gen).to(torch.float8_e4m3fn)  # NVFP4 block scales
    assert torch.equal(swizzle_scales(e4m3).view(torch.uint8), to_blocked(e4m3).view(torch.uint8))


def test_swizzle_needs_a_matrix():
    with pytest.raises(ValueError, match="needs a 2D"):
        swizzle_scales(torch.zeros(4, 4, 4))


@pytest.mark.parametrize("cols", [8, 16])
def test_swizzle_sm100_token_group_scales_match_torchao_moe_layout(cols):
    """The 2d x 3d native grouped GEMM's token scales, laid out on the device (each group from a multiple of 128
    rows, rows past the last offset dropped): bit for bit torchao's MoE layout for M groups, the rest of the
    any-group-sizes buffer zero."""
    layouts = pytest.importorskip("torchao.prototype.moe_training.kernels.mxfp8.quant")
    from autoprec.kernels.cuda.scaled_grouped_mm import _row_group_scales

    offs = torch.tensor([5, 0, 130, 128, 1]).cumsum(0).to(torch.int32)  # an empty group, one of 128 and 130 rows
    scales = torch.randint(1, 256, (int(offs[-1]) + 3, cols), generator=torch.Generator().manual_seed(cols),
                           dtype=torch.uint8)
    want, _ = layouts.torch_to_blocked_2d_M_groups(scales, offs, block_size=32)
    assert_prefix_equal(_row_group_scales(scales, offs), want)


def test_swizzle_sm100_k_group_scales_match_torchao_moe_layout():
    """The 2d x 2d native grouped GEMM's scales, K-grouped (groups of whole 4-column tiles, as 128-token padding
    makes them), each group's chunk swizzled on its own on the device: bit for bit torchao's MoE layout for K
    groups."""
    layouts = pytest.importorskip("torchao.prototype.moe_training.kernels.mxfp8.quant")
    from autoprec.kernels.cuda.scaled_grouped_mm import _k_group_scales

    ends = torch.tensor([8, 8, 24, 24, 40], dtype=torch.int32)  # scale columns; empty groups first and inside
    scales = torch.randint(1, 256, (200, 40), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    want, _ = layouts.torch_to_blocked_2d_K_groups(scales, ends, block_size=32)
    assert_prefix_equal(_k_group_scales(scales, ends), want)


def assert_prefix_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal where both buffers hold scales (each is sized for any group sizes its own way); zero past that."""
    got, want = got.view(torch.uint8).flatten(), want.view(torch.uint8).flatten()
    n = min(got.numel(), want.numel())
    assert torch.equal(got[:n], want[:n]) and not got[n:].any() and not want[n:].any()
