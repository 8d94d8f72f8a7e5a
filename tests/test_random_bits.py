"""Stochastic rounding's random bits: a pure hash of (stream, index), the same in every execution."""
import torch

from autoprec.kernels.core.random_bits import (
    SR_BITS,
    group_seed,
    inv_mix32,
    mix32,
    offset_seed,
    sr_bits,
    sr_stream,
    stream_keys,
)
from autoprec.planner.gemm_spec import key_seeds, path_key

from helpers import bits_equal

PINNED_0 = [1329799, 15723374, 3858929, 9140358]
PINNED_5_7 = [8465272, 13969801, 14893414, 14510815]


def test_bits_are_pinned():
    """The bits are part of the numerics: a change to the hash changes every SR result, so it is pinned."""
    assert sr_bits((4,), 0).tolist() == PINNED_0
    assert sr_bits((2, 2), sr_stream(5, 7)).flatten().tolist() == PINNED_5_7


def test_bits_are_uniform_and_streams_independent():
    a = sr_bits((1 << 20,), 1).double() / (1 << SR_BITS)
    b = sr_bits((1 << 20,), 2).double() / (1 << SR_BITS)
    assert abs(a.mean() - 0.5) < 3 * (1 / 12) ** 0.5 / 2**10  # within 3 standard errors
    counts = torch.histc(a, bins=256, min=0, max=1)
    expected = a.numel() / 256
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 255 + 5 * (2 * 255) ** 0.5  # 255 degrees of freedom, 5 sigma
    assert abs(torch.corrcoef(torch.stack((a, b)))[0, 1]) < 5e-3
    assert 0 <= int(sr_bits((1000,), 3).min()) and int(sr_bits((1000,), 3).max()) < 1 << SR_BITS


def test_neighbouring_steps_and_indices_decorrelate():
    """Consecutive steps of one GEMM, and neighbouring elements, share no structure."""
    s0 = sr_bits((1 << 16,), sr_stream(4, 10)).double()
    s1 = sr_bits((1 << 16,), sr_stream(4, 11)).double()
    assert abs(torch.corrcoef(torch.stack((s0, s1)))[0, 1]) < 0.02
    assert abs(torch.corrcoef(torch.stack((s0[:-1], s0[1:])))[0, 1]) < 0.02


def test_mix32_is_a_bijection_with_avalanche():
    x = torch.arange(1 << 20, dtype=torch.int64)
    assert mix32(x).unique().numel() == x.numel()
    flips = mix32(x) ^ mix32(x ^ 1)
    frac = sum(float(((flips >> i) & 1).double().mean()) for i in range(32)) / 32
    assert abs(frac - 0.5) < 0.01


def test_an_offset_seed_at_the_offset_step_draws_the_seeds_bits():
    """A graph run by several blocks holds seeds offset by the block's key and gets the step XOR that key: the
    bits are those of the block's own seed at the real step, for plain and per-group (experts) streams."""
    gen = torch.Generator().manual_seed(0)
    for seed, step, offset in torch.randint(0, 1 << 32, (200, 3), generator=gen, dtype=torch.int64).tolist():
        assert inv_mix32(mix32(seed)) == seed and mix32(inv_mix32(seed)) == seed
        shifted = offset_seed(seed, offset)
        assert stream_keys(sr_stream(shifted, step ^ offset)) == stream_keys(sr_stream(seed, step))
        g = step % 64
        assert stream_keys(sr_stream(group_seed(shifted, g), step ^ offset)) == stream_keys(
            sr_stream(group_seed(seed, g), step))
    assert bits_equal(sr_bits((3, 5), sr_stream(offset_seed(9, 1234), 7 ^ 1234)), sr_bits((3, 5), sr_stream(9, 7)))


def test_path_keys_split_at_any_module():
    """A GEMM's path key is its block's key XOR the key of its path inside the block (at the block's depth), so
    every block's graph can hold the same seeds; different blocks, depths and parts give different keys."""
    assert path_key("blocks.3.attn.qkv") == path_key("blocks.3") ^ path_key("attn.qkv", 2)
    assert path_key("") == 0
    keys = {path_key(p) for p in ("blocks.3.attn.qkv", "blocks.4.attn.qkv", "blocks.3.mlp.fc1", "attn.qkv",
                                  "model.blocks.3.attn.qkv", "qkv.attn.3.blocks")}
    assert len(keys) == 6
    seeds = [s for path in ("a.0.fc", "a.1.fc") for role in ("fprop", "dgrad") for s in key_seeds(0, (path, role, 0))]
    assert len(set(seeds)) == len(seeds)
