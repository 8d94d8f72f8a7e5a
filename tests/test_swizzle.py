"""Scale swizzling for Blackwell's block-scaled MMA, bit for bit against torchao's ``to_blocked``."""
import pytest
import torch

from autoprec.kernels.swizzle import swizzle_scales

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
