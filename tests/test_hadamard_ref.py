"""Random Hadamard transform: orthogonal, preserves products, fixed and seedable signs."""
import numpy as np
import pytest
import torch

from autoprec.kernels import rht_ref, rht_signs

from helpers import bits_equal


def rht_matrix(signs: torch.Tensor) -> torch.Tensor:
    """The ±1 matrix H16 · diag(signs) (Sylvester's H16; rht_ref applies it times 1/4): the transform's definition,
    which rht_ref's butterflies compute."""
    h = torch.ones(1, 1)
    while h.shape[0] < 16:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h * signs.to(torch.float32)[None, :]


def test_matrix_is_orthogonal():
    m = rht_matrix(rht_signs()) * 0.25
    assert torch.equal(m @ m.t(), torch.eye(16))
    assert set(rht_signs().tolist()) == {-1.0, 1.0}


def test_signs_seedable():
    assert torch.equal(rht_signs(5), rht_signs(5)) and not torch.equal(rht_signs(0), rht_signs(1))


def test_product_unchanged_to_fp32_rounding():
    gen = torch.Generator().manual_seed(0)
    dy, x = torch.randn(256, 64, generator=gen), torch.randn(256, 96, generator=gen)  # wgrad: reduce tokens
    plain = dy.double().t() @ x.double()
    ht = rht_ref(dy, 0).double().t() @ rht_ref(x, 0).double()
    assert torch.allclose(ht, plain, rtol=0, atol=1e-5 * plain.abs().max().item())


def test_inverse_and_axis():
    x = torch.randn(3, 32, 5)
    y = rht_ref(x, 1)
    m = rht_matrix(rht_signs()) * 0.25
    back = torch.einsum("ij,bkiz->bkjz", m, y.unflatten(1, (2, 16))).flatten(1, 2)
    assert torch.allclose(back, x, atol=1e-6)
    assert bits_equal(rht_ref(x.movedim(1, -1), -1).movedim(-1, 1), y)


def test_bad_length():
    with pytest.raises(ValueError, match=r"RHT: dim 0 of shape \(24, 4\)"):
        rht_ref(torch.randn(24, 4), 0)


def test_rht_ref_rounds_in_the_butterfly_order():
    """Each output is the fast Walsh-Hadamard transform's sums, each rounded once to fp32 (the order every
    kernel reproduces bit for bit), after the signs and + 0 (a zero, of either sign, gives +0, never -0: padding
    quantizes to zero bytes): checked against scalar float32 arithmetic, on values of wide range and zeros."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(40, 16, generator=gen) * torch.exp2(torch.randint(-20, 20, (40, 16), generator=gen).float())
    x[:2], x[2, ::2] = -0.0, 0.0
    signs = rht_signs(7)
    expected = []
    for row in x.numpy():
        u = [np.float32(v) * np.float32(s) + np.float32(0) for v, s in zip(row, signs.tolist())]
        for h in (1, 2, 4, 8):
            for i in range(16):
                if not i & h:
                    u[i], u[i + h] = u[i] + u[i + h], u[i] - u[i + h]
        expected.append([v * np.float32(0.25) for v in u])
    y = rht_ref(x, 1, signs)
    assert bits_equal(y, torch.from_numpy(np.array(expected, dtype=np.float32)))
    assert y[:2].view(torch.int32).eq(0).all()
