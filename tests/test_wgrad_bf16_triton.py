"""The bf16 experts' wgrad kernel (kernels/triton/wgrad_bf16.py) in the interpreter: both operands read where they
lie, whatever their strides, each group's product equal to its own fp32 product of the bf16 values, an empty group's
zero, and offsets a model gets wrong never read a token outside the operands."""
import pytest
import torch

pytest.importorskip("triton")

from test_bad_offsets import BAD

from autoprec.kernels.triton.wgrad_bf16 import bf16_wgrad

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on a CPU
BF16, FP32 = torch.bfloat16, torch.float32
M, N, T = 40, 136, 300  # N: two column tiles, the second partial
ENDS = [0, 37, 37, 200, 291]  # an empty first and third group, one over several K tiles, nine tokens past the end
GUARD = 64


def tokens(rows: int, cols: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).to(BF16)


def loop(a: torch.Tensor, b: torch.Tensor, ends: list[int]) -> torch.Tensor:
    """Each group's product in fp32 (the reference the kernel meets up to accumulation order)."""
    starts = [0] + ends[:-1]
    return torch.stack([a[:, s:e].float() @ b[s:e].float() for s, e in zip(starts, ends)])


@pytest.mark.parametrize("a_major", ["m", "t"])  # unit stride along M (the token rows transposed) or along T
@pytest.mark.parametrize("b_major", ["n", "t"])
@pytest.mark.parametrize("out_dtype", [FP32, BF16])
def test_wgrad_reads_operands_in_place_and_equals_each_groups_product(a_major, b_major, out_dtype):
    a = tokens(T, M, 0).t() if a_major == "m" else tokens(M, T, 0)
    b = tokens(N, T, 1).t() if b_major == "t" else tokens(T, N, 1)
    got = bf16_wgrad(a.to(DEVICE), b.to(DEVICE), torch.tensor(ENDS, dtype=torch.int32, device=DEVICE), out_dtype).cpu()
    want = loop(a, b, ENDS)
    assert got.dtype == out_dtype and got.shape == (len(ENDS), M, N)
    assert not got[0].any() and not got[2].any()
    tol = 2**-7 if out_dtype == BF16 else 1e-5
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * want.abs().max().item())


@pytest.mark.parametrize("ends", list(BAD.values()), ids=list(BAD))
def test_wgrad_reads_no_token_outside_its_operands(ends):
    """Each operand a view of a buffer whose tokens past T (and, for the transposed one, before it) are NaN: a
    read there would spread into the product."""
    t = 100
    a_rows = torch.full((t + 2 * GUARD, M), float("nan"), dtype=BF16, device=DEVICE)
    a_rows[GUARD:GUARD + t] = tokens(t, M, 0).to(DEVICE)
    b = torch.full((t + GUARD, N), float("nan"), dtype=BF16, device=DEVICE)
    b[:t] = tokens(t, N, 1).to(DEVICE)
    out = bf16_wgrad(a_rows[GUARD:GUARD + t].t(), b[:t], torch.tensor(ends, dtype=torch.int32, device=DEVICE), FP32)
    assert not out.isnan().any()
