"""Group offsets a model gets wrong (past the tokens, negative, decreasing): the CPU path raises naming them; the
device paths, which read them only on the device, give undefined values but never read or write outside their
tensors (Triton in the interpreter, each output a view of a larger buffer whose tail must stay untouched, each
input a view whose tail is NaN)."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from autoprec.formats import get_format
from autoprec.kernels.core.operand import Operand
from autoprec.kernels.dispatch.grouped_mm import grouped_mm
from autoprec.kernels.reference.quantize import quantize_ref
from autoprec.kernels.triton.grouped_mm import TC_BLOCKS, bf16_dot, grouped_wgrad_tc_triton, launch_grouped
from autoprec.kernels.triton.quantize_grouped import quantize_batches_triton
from autoprec.kernels.triton.quantize_k_groups import quantize_k_groups_triton

from helpers import stand_in_gpu
from test_sm100_grouped_native import fake_scaled_grouped_mm

T, K, N, GUARD = 100, 64, 32, 300
BAD = {"past the tokens": [40, 40, 250], "decreasing": [60, 20, 100], "negative": [-200, 30, 90]}


@pytest.mark.parametrize("ends", list(BAD.values()), ids=list(BAD))
def test_cpu_grouped_mm_names_bad_offsets(ends):
    a, w = torch.randn(T, K), torch.randn(len(ends), K, N)
    with pytest.raises(ValueError, match=r"offsets .* must be non-decreasing and within 0\.\.100"):
        grouped_mm(a, w, torch.tensor(ends, dtype=torch.int32), "nvfp4")


@pytest.mark.parametrize("ends", list(BAD.values()), ids=list(BAD))
def test_experts_gemm_stays_inside_its_tensors_with_bad_offsets(ends):
    fmt = get_format("nvfp4")
    tokens = torch.full((T + GUARD, K), float("nan"))
    tokens[:T] = torch.randn(T, K)  # rows past T quantize to NaN blocks: read there, they would spread
    q = quantize_ref(tokens, fmt, 1)
    a = Operand(fmt, q.codes[:T], q.scales[:T], None, T, K)
    codes, scales, ts = quantize_batches_triton(torch.randn(len(ends), K, N), fmt, seed=None, step=torch.tensor(0),
                                                tile2d=False)
    b = Operand(fmt, codes.reshape(len(ends) * N, -1), scales.reshape(len(ends) * N, -1), None, len(ends) * N, K)
    buffer = torch.full((T + GUARD, N), 7.0)
    launch_grouped(a, b, None, ts, buffer[:T], bf16_dot(), TC_BLOCKS, experts=len(ends),
                   offs=torch.tensor(ends, dtype=torch.int32))
    assert torch.equal(buffer[T:], torch.full((GUARD, N), 7.0)), "written past the output"


@pytest.mark.parametrize("ends", list(BAD.values()), ids=list(BAD))
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_k_grouped_quantizer_reads_no_token_past_its_input(fmt, ends):
    tokens = torch.full((16, T + GUARD), float("nan"))
    tokens[:, :T] = torch.randn(16, T)  # the kernel must not read the NaN columns past T
    codes, scales, ts, _ = quantize_k_groups_triton(tokens[:, :T], get_format(fmt), 1,
                                                    torch.tensor(ends, dtype=torch.int32), seed=None,
                                                    step=torch.tensor(0))
    nan_scale = (scales.view(torch.uint8) == 255) if fmt == "mxfp8" else scales.float().isnan()  # a token past T
    assert not nan_scale.any() and (ts is None or not ts.isnan().any())


@pytest.mark.parametrize("ends", list(BAD.values()), ids=list(BAD))
def test_wgrad_gemm_reads_no_column_outside_its_operands(ends):
    """The K-grouped operands' padded ends follow the offsets (negative ones for a negative group size): the
    kernel holds its reduction to the operands' columns. Before them lies NaN."""
    fmt = get_format("mxfp8")
    offs = torch.tensor(ends, dtype=torch.int32)
    ops = []
    for x, axis in ((torch.randn(16, T), 1), (torch.randn(T, N), 0)):
        codes, scales, _, padded = quantize_k_groups_triton(x, fmt, axis, offs, seed=None, step=torch.tensor(0))
        rows, kp = codes.shape
        buffer = torch.full((GUARD * kp + codes.numel(),), 0x7F, dtype=torch.uint8)  # E4M3 NaN codes, then the codes
        buffer[GUARD * kp:] = codes.view(torch.uint8).flatten()
        ops.append(Operand(fmt, buffer[GUARD * kp:].view(rows, kp).view(codes.dtype), scales, None, rows, kp))
    out = grouped_wgrad_tc_triton(*ops, padded, torch.float32)
    assert not out.isnan().any()


@pytest.mark.parametrize("ends", list(BAD.values()), ids=list(BAD))
def test_sm100_native_grouped_gemm_gets_offsets_within_its_operands(monkeypatch, ends):
    """torch's grouped kernel trusts its offsets: the native path hands it the model's held to a partition of the
    tokens (experts' fprop) or of the padded columns (wgrad)."""
    stand_in_gpu(monkeypatch, (10, 0))
    given = []

    def recording(*args, **kwargs):
        given.append((args[0].shape, kwargs["offs"].tolist()))
        return fake_scaled_grouped_mm(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_grouped_mm", recording)
    offs = torch.tensor(ends, dtype=torch.int32)
    grouped_mm(torch.randn(T, K), torch.randn(len(ends), K, N), offs, "mxfp8", out_dtype=torch.bfloat16)
    grouped_mm(torch.randn(16, T), torch.randn(T, N), offs, "mxfp8", out_dtype=torch.bfloat16)
    (fprop_a, fprop_offs), (wgrad_a, wgrad_offs) = given
    for held, total in ((fprop_offs, fprop_a[0]), (wgrad_offs, wgrad_a[1])):  # tokens; padded columns
        assert held == sorted(held) and 0 <= held[0] and held[-1] <= total
