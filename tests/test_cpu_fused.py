"""The fused C quantizer (kernels/cpu_fused.py) against the pure-torch references, bit for bit."""
import itertools

import pytest
import torch

from autoprec.formats import get_format
from autoprec.kernels import cpu_fused, dequantize_ref, dispatch, quantize_ref, rht_ref, rht_signs
from autoprec.kernels.random_bits import sr_bits

from helpers import bits_equal, edge_tensor

pytestmark = pytest.mark.skipif(cpu_fused.unavailable_reason() is not None,
                                reason=f"fused CPU kernels: {cpu_fused.unavailable_reason()}")

# (format, options) x axis x SR x RHT: every quantizer configuration a plan can ask for
FORMATS = [("nvfp4", {}), ("nvfp4", {"tile2d": True}), ("mxfp8", {}), ("mxfp8", {"scale_mode": "floor"}),
           ("mxfp8_e5m2", {}), ("mxfp8_e5m2", {"scale_mode": "floor"})]
CASES = list(itertools.product(range(len(FORMATS)), [0, 1], [False, True], [False, True]))


def inputs(tile2d: bool, axis: int) -> list[torch.Tensor]:
    """Edge blocks (NaN, ±Inf, zero, tiny, huge), small and large scales, and a 3D activation."""
    xs = [edge_tensor(64, 96), edge_tensor(96, 64, seed=1) * 1e-3, torch.randn(32, 64) * 300]
    if not tile2d:
        xs.append(torch.randn(32, 3, 64) if axis == 0 else torch.randn(3, 64, 5))  # dims after the block axis
    return xs


@pytest.mark.parametrize("fi,axis,sr,rht", CASES, ids=[f"{FORMATS[f][0]}{FORMATS[f][1] or ''}-ax{a}-sr{s}-rht{r}"
                                                     for f, a, s, r in CASES])
def test_fused_quantize_matches_reference(fi, axis, sr, rht):
    fmt, opts = FORMATS[fi]
    for x in inputs(opts.get("tile2d", False), axis):
        stream = 0x1234_0000_0007 if sr else None
        xr = rht_ref(x, axis, rht_signs(3)) if rht else x
        want = quantize_ref(xr, fmt, axis, rounding="sr" if sr else "rne",
                            rand=sr_bits(x.shape, stream) if sr else None, **opts)
        got = cpu_fused.quantize_cpu(x, get_format(fmt), axis, seed=stream, rht=rht, rht_signs=rht_signs(3), **opts)
        assert bits_equal(got.codes.view(torch.uint8), want.codes.view(torch.uint8))
        assert bits_equal(got.scales, want.scales) and got.tile_rows == want.tile_rows
        assert want.tensor_scale is None or bits_equal(got.tensor_scale, want.tensor_scale)
        assert bits_equal(cpu_fused.dequantize_cpu(got).contiguous(), dequantize_ref(want).contiguous())


def test_dispatch_runs_the_fused_kernels_by_default(monkeypatch):
    """``auto`` on CPU takes the C path, ``ref`` the reference; both give the same bits, SR included."""
    calls = []
    real = cpu_fused.quantize_cpu
    monkeypatch.setattr(cpu_fused, "quantize_cpu", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(64, 128)
    fused = dispatch.quantize(x, "nvfp4", 0, rounding="sr", seed=9, rht=True)
    assert calls
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    ref = dispatch.quantize(x, "nvfp4", 0, rounding="sr", seed=9, rht=True)
    assert len(calls) == 1 and bits_equal(fused.codes, ref.codes) and bits_equal(fused.scales, ref.scales)
    assert bits_equal(dispatch.dequantize(fused), dequantize_ref(ref))


def test_without_a_compiler_the_reference_runs(monkeypatch, tmp_path):
    """No C compiler: the reason names it, and quantization still runs (the reference, same bits)."""
    monkeypatch.setenv("AUTOPREC_CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("AUTOPREC_CACHE", str(tmp_path))
    cpu_fused._library.cache_clear()
    try:
        assert "no C compiler" in cpu_fused.unavailable_reason() and "no-such-cc" in cpu_fused.unavailable_reason()
        x = torch.randn(32, 64)
        assert bits_equal(dispatch.quantize(x, "mxfp8").codes, quantize_ref(x, "mxfp8").codes)
    finally:
        cpu_fused._library.cache_clear()


def test_an_unwritable_cache_is_named(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("AUTOPREC_CACHE", str(blocker / "cache"))  # below a file: cannot be created
    cpu_fused._library.cache_clear()
    try:
        assert "AUTOPREC_CACHE" in cpu_fused.unavailable_reason()
        x = torch.randn(32, 64)
        assert bits_equal(dispatch.quantize(x, "nvfp4").codes, quantize_ref(x, "nvfp4").codes)
    finally:
        cpu_fused._library.cache_clear()
