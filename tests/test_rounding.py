"""Element rounding against independent cast oracles (ml_dtypes and torch), every code and midpoint."""
import ml_dtypes
import numpy as np
import pytest
import torch

from autoprec.formats import E2M1, E4M3, E5M2
from autoprec.kernels.reference.rounding import (
    e2m1_decode,
    e2m1_encode,
    e8m0_decode,
    e8m0_floor,
    e8m0_rceil,
    pack_nibbles,
    round_to_element,
    unpack_nibbles,
)

from helpers import bits_equal

ORACLES = {"e2m1": ml_dtypes.float4_e2m1fn, "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
ELEMS = [E2M1, E4M3, E5M2]


def grid(elem) -> np.ndarray:
    """Every finite non-negative value of the element type, from ml_dtypes' own table of codes."""
    codes = np.arange(16 if elem is E2M1 else 256, dtype=np.uint8)
    vals = codes.view(ORACLES[elem.name]).astype(np.float32)
    return np.unique(vals[np.isfinite(vals) & (vals >= 0)])


def probe_values(elem) -> np.ndarray:
    """Grid points, midpoints and their fp32 neighbours, both signs, plus saturating values."""
    g = grid(elem)
    mids = ((g[:-1].astype(np.float64) + g[1:]) / 2).astype(np.float32)
    pts = np.concatenate([g, mids, [elem.max * 1.01, elem.max * 4, 3e38]]).astype(np.float32)
    pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(0))])
    return np.concatenate([pts, -pts]).astype(np.float32)


def oracle(x: np.ndarray, elem) -> np.ndarray:
    return np.clip(x, -elem.max, elem.max).astype(ORACLES[elem.name]).astype(np.float32)


@pytest.mark.parametrize("elem", ELEMS, ids=lambda e: e.name)
def test_every_code_and_midpoint_matches_ml_dtypes(elem):
    x = probe_values(elem)
    ours = round_to_element(torch.from_numpy(x), elem)
    assert bits_equal(ours, torch.from_numpy(oracle(x, elem)))


@pytest.mark.parametrize("elem", [E4M3, E5M2], ids=lambda e: e.name)
def test_matches_torch_float8_cast(elem):
    x = torch.from_numpy(probe_values(elem))
    ref = torch.clamp(x, -elem.max, elem.max).to(elem.torch_dtype).to(torch.float32)
    assert bits_equal(round_to_element(x, elem), ref)


@pytest.mark.parametrize("elem", ELEMS, ids=lambda e: e.name)
def test_random_fp32_matches_ml_dtypes(elem):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(200_000, generator=gen) * torch.exp2(torch.randint(-30, 20, (200_000,), generator=gen).float())
    assert bits_equal(round_to_element(x, elem), torch.from_numpy(oracle(x.numpy(), elem)))


# hand-written edge cases: (input, expected)
EDGES = {
    "e2m1": [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0),
             (5.0001, 6.0), (7.0, 6.0), (-0.25, -0.0), (-5.0, -4.0), (float("inf"), 6.0), (-1e30, -6.0)],
    "e4m3": [(17.0, 16.0), (19.0, 20.0), (464.0, 448.0), (1e6, 448.0), (2.0**-10, 0.0),
             (3 * 2.0**-10, 2.0**-8), (2.0**-9, 2.0**-9), (1.999, 2.0), (-0.0, -0.0), (float("-inf"), -448.0)],
    "e5m2": [(2.0**-17, 0.0), (3 * 2.0**-17, 2.0**-15), (61440.0, 57344.0), (1e9, 57344.0), (1.125, 1.0),
             (1.375, 1.5)],
}


@pytest.mark.parametrize("elem", ELEMS, ids=lambda e: e.name)
def test_hand_written_edges(elem):
    x, want = zip(*EDGES[elem.name])
    got = round_to_element(torch.tensor(x, dtype=torch.float32), elem)
    assert bits_equal(got, torch.tensor(want, dtype=torch.float32))


@pytest.mark.parametrize("elem", ELEMS, ids=lambda e: e.name)
def test_nan_stays_nan(elem):
    assert torch.isnan(round_to_element(torch.tensor([float("nan")]), elem)).all()


def test_e2m1_codes_round_trip_all_16():
    codes = torch.arange(16, dtype=torch.uint8)
    vals = e2m1_decode(codes)
    assert vals.tolist()[:8] == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert torch.equal(e2m1_encode(vals), codes)
    ml = np.arange(16, dtype=np.uint8)
    # ml_dtypes float4 stores one code per byte in the low nibble
    assert np.array_equal(ml.view(ml_dtypes.float4_e2m1fn).astype(np.float32), vals.numpy())


def test_nibble_packing_even_index_low():
    codes = torch.tensor([[1, 2, 3, 4]], dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0x43]]
    assert torch.equal(unpack_nibbles(packed), codes)


def test_e8m0_decode_every_code_matches_ml_dtypes():
    codes = np.arange(256, dtype=np.uint8)
    ref = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert bits_equal(e8m0_decode(torch.from_numpy(codes)), torch.from_numpy(ref))


def _exact_exponents(amax: np.ndarray, elem, rule: str) -> np.ndarray:
    q = (amax / np.float32(elem.max)).astype(np.float32).astype(np.float64)
    with np.errstate(divide="ignore"):
        if rule == "rceil":
            e = np.ceil(np.log2(q))
        else:
            e = np.floor(np.log2(amax.astype(np.float64))) - elem.emax
    return np.clip(np.where(amax > 0, e, -127), -127, 127).astype(np.int32)


@pytest.mark.parametrize("rule", ["rceil", "floor"])
@pytest.mark.parametrize("elem", [E4M3, E5M2], ids=lambda e: e.name)
def test_e8m0_exponents_exact(rule, elem):
    powers = np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32)
    gen = np.random.default_rng(0)
    with np.errstate(over="ignore"):
        amax = np.concatenate([
            [0.0], powers, np.nextafter(powers, np.float32(np.inf)), np.nextafter(powers, np.float32(0)),
            powers * np.float32(elem.max), gen.standard_normal(10_000) * 10.0 ** gen.integers(-40, 38, 10_000),
        ]).astype(np.float32)
    amax = np.abs(amax[np.isfinite(amax)])
    fn = e8m0_rceil if rule == "rceil" else e8m0_floor
    got = fn(torch.from_numpy(amax), elem)
    assert np.array_equal(got.numpy(), _exact_exponents(amax, elem, rule))
