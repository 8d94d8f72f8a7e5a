"""Unquantized experts GEMMs (``exact`` bf16, ``bf16`` plans) on torch's grouped GEMM (``grouped_torch``): the
output torch leaves undefined is zeroed on the device, operands torch's kernel would not take are copied to a
layout it takes, and the path is chosen on sm_90 / sm_100 only (here their capability is stood in for, and
torch's CPU op runs in place of its CUTLASS kernel)."""
import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

from autoprec.kernels.cuda.grouped_bf16 import torch_grouped_mm, torch_grouped_problem
from autoprec.kernels.dispatch import dense as dispatch
from autoprec.kernels.dispatch.grouped_mm import grouped_mm
from autoprec.kernels.dispatch.grouped_route import grouped_route

from helpers import stand_in_gpu
from test_no_host_sync import HostReads

SIZES = [5, 0, 16, 37, 22]  # an empty expert
OFFS = torch.tensor(SIZES, dtype=torch.int32).cumsum(0).to(torch.int32)
T = int(OFFS[-1]) + 3  # three rows past the last offset
BF16 = torch.bfloat16


def data(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(BF16)


@pytest.fixture
def poisoned(monkeypatch):
    """torch._grouped_mm with NaN where no group writes (the rows past the last offset, an empty group's wgrad), as
    a GPU's uninitialized output can hold (out of sight of a ``HostReads`` around it); records the operands it was
    given."""
    real, calls = torch._grouped_mm, []

    def run(a, b, offs=None, bias=None, out_dtype=None):
        calls.append((a, b))
        out = real(a, b, offs, out_dtype=out_dtype)
        with _disable_current_modes():
            if a.ndim == 2 and b.ndim == 3:
                out[int(offs[-1]):] = float("nan")
            elif a.ndim == 2:
                out[torch.diff(offs, prepend=offs.new_zeros(1)) == 0] = float("nan")
        return out

    monkeypatch.setattr(torch, "_grouped_mm", run)
    return calls


def per_group(a, b, offs):
    """The product as ``grouped_mm``'s loop makes it on the CPU (one torch.mm per group)."""
    return grouped_mm(a, b, offs)


def test_torch_grouped_mm_zeroes_what_torch_leaves_undefined(poisoned):
    a, w, dy = data(T, 32), data(5, 32, 48, seed=1), data(T, 48, seed=2)
    fprop = torch_grouped_mm(a, w, OFFS, "2d3d")
    assert torch.equal(fprop, per_group(a, w, OFFS)) and not fprop[-3:].any()
    wgrad = torch_grouped_mm(a.t(), dy, OFFS, "2d2d")
    assert torch.equal(wgrad, per_group(a.t(), dy, OFFS)) and not wgrad[1].any()
    x3, w3 = data(5, 7, 32, seed=3), data(5, 32, 16, seed=4)
    assert torch.equal(torch_grouped_mm(x3, w3, None, "3d3d"), per_group(x3, w3, None))


def test_torch_grouped_mm_copies_operands_its_kernel_would_not_take(poisoned):
    """Operands whose start, strides or layout torch's kernel does not take are copied to one it does; the dim the
    offsets cut is always the strided one, so that every group starts 16 bytes aligned."""
    a = torch.empty(T * 32 + 1, dtype=BF16)[1:].view(T, 32).copy_(data(T, 32))  # start 2 bytes off
    a_cols = data(32, T).t()  # the cut dim unit-stride
    w = data(5, 48, 32, seed=1).mT  # (5, 32, 48) column-major: taken as it is
    for x in (a, a_cols):
        out = torch_grouped_mm(x, w, OFFS, "2d3d")
        sent, sent_w = poisoned[-1]
        assert sent.stride() == (32, 1) and sent.data_ptr() % 16 == 0 and sent_w is w
        assert torch.equal(out, per_group(x.contiguous(), w, OFFS))
    a_t, dy = data(32, T), data(T, 48, seed=2)  # a wgrad's (32, T) row-major: the cut dim unit-stride
    out = torch_grouped_mm(a_t, dy, OFFS, "2d2d")
    assert poisoned[-1][0].stride() == (1, 32) and poisoned[-1][1] is dy
    assert torch.equal(out, per_group(a_t, dy, OFFS))


@pytest.mark.parametrize("capability,layout,exact,dtypes,out_dtype,shapes,why", [
    ((9, 0), "2d3d", True, (BF16, BF16), BF16, ((64, 32), (4, 32, 48)), None),
    ((10, 0), "2d2d", False, (torch.float32, BF16), BF16, ((32, 64), (64, 40)), None),
    ((9, 0), "2d3d", True, (torch.float32, torch.float32), torch.float32, ((64, 32), (4, 32, 48)), "bf16 only"),
    ((9, 0), "2d3d", False, (BF16, BF16), torch.float32, ((64, 32), (4, 32, 48)), "bf16 only"),
    ((9, 0), "2d3d", True, (BF16, BF16), BF16, ((64, 36), (4, 36, 48)), "16 bytes"),
    ((9, 0), "2d2d", True, (BF16, BF16), BF16, ((36, 64), (64, 40)), "16 bytes"),
    ((8, 0), "2d3d", True, (BF16, BF16), BF16, ((64, 32), (4, 32, 48)), "sm_90 and sm_100 only"),
    ((12, 0), "2d3d", True, (BF16, BF16), BF16, ((64, 32), (4, 32, 48)), "sm_90 and sm_100 only"),
    (None, "2d3d", True, (BF16, BF16), BF16, ((64, 32), (4, 32, 48)), "sm_90 and sm_100 only"),
    ((10, 0), "2d3d", True, (BF16, BF16), BF16, ((64, 32), (1024, 32, 48)), "take at most 1023"),
    ((9, 0), "3d3d", True, (BF16, BF16), BF16, ((1024, 64, 32), (1024, 32, 48)), "1024 groups"),  # a batched product
])
def test_sm90_torch_grouped_path_table(monkeypatch, capability, layout, exact, dtypes, out_dtype, shapes, why):
    groups = shapes[1][0] if layout != "2d2d" else 4
    problem = torch_grouped_problem(capability, layout, exact, dtypes, out_dtype, shapes, groups)
    assert problem is None if why is None else why in problem
    if capability is not None:
        stand_in_gpu(monkeypatch, capability)
        route = grouped_route(torch.device("cpu"), layout, "exact" if exact else "bf16", dtypes, shapes, groups, False,
                              out_dtype)
        assert route.kind == "torch" if why is None else why in route.why  # else Triton's bf16 kernels, or a loop


def test_sm90_torch_grouped_path_follows_the_kernel_mode(monkeypatch):
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    assert "AUTOPREC_KERNELS=triton" in torch_grouped_problem((9, 0), "2d3d", True, (BF16, BF16), BF16,
                                                              ((64, 32), (4, 32, 48)), 4)


@pytest.mark.parametrize("fmt", ["exact", "bf16"])
def test_sm90_unquantized_experts_gemms_run_torch_grouped_mm_without_host_reads(monkeypatch, poisoned, fmt):
    """On sm_90 (stood in for) an experts fprop and wgrad in bf16 are one torch._grouped_mm each, read nothing on
    the host, and equal the per-group loop; a ``bf16`` product of fp32 operands casts them first."""
    a, w, dy = data(T, 32), data(5, 32, 48, seed=1), data(T, 48, seed=2)
    want = per_group(a, w, OFFS), per_group(a.t(), dy, OFFS)
    if fmt == "bf16":
        a = a.float()
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    with HostReads() as rec:
        got = (grouped_mm(a, w, OFFS, fmt, out_dtype=BF16), grouped_mm(a.t(), dy, OFFS, fmt, out_dtype=BF16))
    assert rec.found == [] and len(poisoned) == 2
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

