"""AUTOPREC_KERNELS=ref_inductor: the reference compiled by inductor stays bit-identical to eager."""
import pytest
import torch

from autoprec.kernels import dequantize_ref, quantize_ref
from autoprec.kernels.core.random_bits import sr_bits

from helpers import bits_equal, edge_tensor

CASES = [
    ("nvfp4", dict()),
    ("nvfp4", dict(tile2d=True, rounding="sr")),
    ("mxfp8", dict()),
    ("mxfp8_e5m2", dict(scale_mode="floor", rounding="sr")),
]


@pytest.mark.parametrize("fmt,opts", CASES, ids=[f"{f}-{'-'.join(map(str, o.values())) or 'rne'}" for f, o in CASES])
def test_compiled_reference_is_bit_exact(monkeypatch, fmt, opts):
    xs = [edge_tensor(64, 96), torch.randn(48, 64) * 1e-3, torch.randn(32, 128) * 300]
    for x in xs:
        rand = sr_bits(x.shape, 5) if opts.get("rounding") == "sr" else None
        monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
        want = quantize_ref(x, fmt, 1, rand=rand, **opts)
        want_values = dequantize_ref(want)
        monkeypatch.setenv("AUTOPREC_KERNELS", "ref_inductor")
        got = quantize_ref(x, fmt, 1, rand=rand, **opts)
        assert bits_equal(got.codes, want.codes) and bits_equal(got.scales, want.scales)
        assert bits_equal(dequantize_ref(got), want_values)
