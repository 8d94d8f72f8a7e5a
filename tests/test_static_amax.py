"""A given (static) NVFP4 tensor amax: the RL phases' activation scales. Every quantizer path (reference, C,
Triton's interpreter) uses it in place of the tensor's own amax, bit for bit alike, and the values follow the
scale chain of DESIGN.md with that amax: blocks above it saturate their E4M3 scale at 448 and their codes at 6."""
import ml_dtypes
import numpy as np
import pytest
import torch

from autoprec.kernels.core.quantized import QuantCopy
from autoprec.kernels.dispatch import dense as dispatch
from autoprec.kernels.reference.quantize import dequantize_ref, quantize_ref

from helpers import assert_same

F32 = np.float32


def bits(amax: float) -> torch.Tensor:
    return torch.tensor(amax, dtype=torch.float32).view(torch.int32)


def oracle(x: torch.Tensor, amax_t: float) -> np.ndarray:
    """Dequantized values of 1x16 NVFP4 under tensor amax ``amax_t``, with ml_dtypes' E4M3 and E2M1 casts."""
    v = x.numpy().astype(F32).reshape(x.shape[0], -1, 16)
    s_enc = F32(F32(2688.0) / F32(amax_t))
    s_dec = F32(F32(1.0) / s_enc)
    amax_b = np.abs(v).max(-1)
    s_b = np.minimum(amax_b * F32(s_enc * F32(1.0 / 6.0)), F32(448.0)).astype(ml_dtypes.float8_e4m3fn).astype(F32)
    e_b = np.minimum(F32(1.0) / (s_b * s_dec), np.finfo(F32).max).astype(F32)
    codes = np.clip(v * e_b[..., None], -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(F32)
    return (codes * s_b[..., None] * s_dec).astype(F32).reshape(x.shape)


@pytest.mark.parametrize("amax_t", [0.5, 3.0, 40.0])
def test_given_amax_follows_the_scale_chain(amax_t):
    """Smaller than the tensor's amax (saturating blocks), equal-ish, and larger."""
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0)) * 2
    q = quantize_ref(x, "nvfp4", amax=bits(amax_t))
    assert np.array_equal(dequantize_ref(q).numpy(), oracle(x, amax_t))
    assert q.tensor_scale.item() == F32(1.0) / F32(F32(2688.0) / F32(amax_t))


def test_own_amax_given_changes_nothing():
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(1))
    own = bits(x.abs().max().item())
    assert_same(quantize_ref(x, "nvfp4", amax=own), quantize_ref(x, "nvfp4"))


@pytest.mark.parametrize("mode", ["auto", "triton"])
@pytest.mark.parametrize("case", ["rows", "cols", "tiles", "sr", "part", "dual"])
def test_every_path_takes_the_given_amax(monkeypatch, mode, case):
    """The C kernels (``auto`` on CPU) and Triton's interpreter equal the reference under a static amax below the
    tensor's, for 1x16 rows, a transposed view read by the column kernels, 16x16 tiles, SR, a part of the rows
    (calibration's samples) and both copies of ``quantize_dual``."""
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(2)) * 3
    amax = bits(1.5)
    rounding, seed = ("sr", 7) if case == "sr" else ("rne", 0)
    src, axis = (x.t(), 0) if case == "cols" else (x, -1)
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    if case == "dual":
        want = dispatch.quantize_dual(x, "nvfp4", QuantCopy(), QuantCopy(), amax=amax)
    else:
        want = dispatch.quantize(src, "nvfp4", axis, rounding=rounding, seed=seed, tile2d=case == "tiles",
                                 amax=amax)
    monkeypatch.setenv("AUTOPREC_KERNELS", mode)
    if case == "dual":
        got = dispatch.quantize_dual(x, "nvfp4", QuantCopy(), QuantCopy(), amax=amax)
        for g, w in zip(got, want):
            assert_same(g, w)
        return
    if case == "part":
        if mode == "triton":
            pytest.skip("parts of rows are the CPU kernels' (calibration's samples)")
        got = dispatch.quantize(src, "nvfp4", axis, rows=slice(3, 9), amax=amax)
        want = dispatch._part_of(want, slice(3, 9), None)
    else:
        got = dispatch.quantize(src, "nvfp4", axis, rounding=rounding, seed=seed, tile2d=case == "tiles", amax=amax)
    assert_same(got, want)
    assert want.tensor_scale.item() == F32(1.0) / F32(F32(2688.0) / F32(1.5))


@pytest.mark.parametrize("mode", ["auto", "triton"])
def test_grouped_tokens_take_the_static_amax(monkeypatch, mode):
    """A 2d x 3d experts product with a static amax for its tokens: each token's quantization (so its output row)
    is the same whichever tokens share its expert, on the CPU loop and the Triton grouped quantizer alike."""
    from autoprec.kernels.dispatch.grouped_mm import grouped_mm

    monkeypatch.setenv("AUTOPREC_KERNELS", mode)
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(48, 32, generator=gen), torch.randn(3, 32, 16, generator=gen)
    a[12] *= 10  # the first expert's own amax is not that of its first 8 tokens
    amax = bits(2.0)
    full = grouped_mm(a, b, torch.tensor([16, 32, 48], dtype=torch.int32), "nvfp4", amax_a=amax,
                      out_dtype=torch.float32)
    alone = grouped_mm(a[:8], b, torch.tensor([8, 8, 8], dtype=torch.int32), "nvfp4", amax_a=amax,
                       out_dtype=torch.float32)
    assert torch.equal(full[:8], alone)
    dynamic = grouped_mm(a[:8], b, torch.tensor([8, 8, 8], dtype=torch.int32), "nvfp4", out_dtype=torch.float32)
    assert not torch.equal(full[:8], dynamic)  # each group's own amax: the tokens routed with it count
    with pytest.raises(ValueError, match="amax_a"):
        grouped_mm(a, b, torch.tensor([16, 32, 48], dtype=torch.int32), "mxfp8", amax_a=amax)
