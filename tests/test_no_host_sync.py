"""The GPU paths never wait for the GPU: a quantization or a block-scaled matmul reads no device value on the
host (``.item()``, ``int(t)``, boolean masks) and copies no host data to the device (tensors built from Python
numbers, constant tensors moved to the device). Each would drain the GPU's queue once per call, dozens of times
a step. Checked here by recording the aten ops the kernels' host code dispatches (Triton in the interpreter);
tests/test_gpu_cuda.py checks it on a GPU with torch's sync debug mode. Also: the decoded (sm_90) matmul finds
values bf16 does not hold on the device, and recomputes that product in fp32."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

pytest.importorskip("triton")

from autoprec.formats import get_format
from autoprec.kernels import dequantize_ref, quantize_ref
from autoprec.kernels.core.operand import as_operand
from autoprec.kernels.core.random_bits import StepStream, sr_stream
from autoprec.kernels.dispatch import dense as dispatch
from autoprec.kernels.triton.quantize import quantize_triton
from autoprec.kernels.triton.quantize_grouped import quantize_batches_triton, quantize_row_groups_triton
from autoprec.kernels.triton.scaled_mm import DOT_FP32, launch
from autoprec.kernels.triton.scaled_mm_decoded import decode_bf16, scaled_mm_decoded, scaled_mm_decoded_triton

from helpers import bits_equal, to_device

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# ops that read a device value on the host or turn host data into a tensor
WAITING_OPS = {"aten._local_scalar_dense", "aten.item", "aten.nonzero", "aten.masked_select", "aten.is_nonzero",
               "aten.equal", "aten.lift_fresh", "aten.lift_fresh_copy"}


class HostReads(TorchDispatchMode):
    """Records the ops in WAITING_OPS, and copies that name a device, dispatched inside it; and ``Tensor.tolist`` of
    an integer tensor (group offsets, steps), which reads it without dispatching an op (not where the mode is
    disabled, as the ops are not). The RHT's float sign vector is host data by contract, read on every call."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []
        self._tolist = torch.Tensor.tolist

    def __enter__(self):
        def tolist(t):
            if not t.is_floating_point() and self in _get_current_dispatch_mode_stack():
                self.found.append("Tensor.tolist")
            return self._tolist(t)

        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket._qualified_op_name.replace("::", ".")
        if name in WAITING_OPS or (name == "aten._to_copy" and "device" in kwargs):
            self.found.append(str(func))
        return func(*args, **kwargs)


DECODED_GEMMS = pytest.mark.parametrize("gemm", [scaled_mm_decoded, scaled_mm_decoded_triton],
                                        ids=["cublas", "triton"])


@DECODED_GEMMS
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_quantize_and_decoded_matmul_read_nothing_on_the_host(fmt, gemm):
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 64, generator=gen).to(DEVICE), torch.randn(64, 32, generator=gen).to(DEVICE)
    bias = torch.randn(32, generator=gen).to(DEVICE)
    f = get_format(fmt)
    quantize_triton(x, f, 1, seed=5, rht=True)  # compiled (and autotuned, which syncs) outside the check
    with HostReads() as rec:
        qa = quantize_triton(x, f, 1, seed=(3 << 32) | 0xFFFFFFF0, rht=True)  # keys above 2**31 too
        qb = quantize_triton(w, f, 0)
        for b, out_dtype in ((None, torch.bfloat16), (bias, torch.float32)):
            gemm(as_operand(qa, 1, "a"), as_operand(qb, 0, "b"), b, out_dtype)
    assert rec.found == []


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_grouped_quantizers_read_nothing_on_the_host(fmt):
    """An experts GEMM's token groups and expert weights, quantized with SR: the offsets and the step stay on the
    device (the per-group loop read both on the host)."""
    gen = torch.Generator().manual_seed(1)
    tokens, experts = torch.randn(70, 64, generator=gen).to(DEVICE), torch.randn(4, 64, 32, generator=gen).to(DEVICE)
    offs, step = torch.tensor([10, 10, 50, 64], dtype=torch.int32).to(DEVICE), torch.tensor(3).to(DEVICE)
    f = get_format(fmt)
    quantize_row_groups_triton(tokens, f, offs, seed=1, step=step)  # compiled (and autotuned) outside the check
    quantize_batches_triton(experts, f, seed=2, step=step, tile2d=f.name == "nvfp4")
    with HostReads() as rec:
        quantize_row_groups_triton(tokens, f, offs, seed=1, step=step)
        quantize_batches_triton(experts, f, seed=2, step=step, tile2d=f.name == "nvfp4")
    assert rec.found == []


def test_gpu_gemm_paths_are_chosen_without_reading_operands():
    """On a GPU the path depends on the formats and shapes alone: operands on the meta device, which has no
    values to read, are enough."""
    a = quantize_ref(torch.randn(32, 64), "mxfp8", 1)
    b = quantize_ref(torch.randn(64, 32), "mxfp8", 0)
    oa, ob = (as_operand(to_device(q, "meta"), k, n) for q, k, n in ((a, 1, "a"), (b, 0, "b")))
    assert dispatch.gemm_path((9, 0), oa, ob) == ("decoded", None)
    assert dispatch.gemm_path((10, 0), oa, ob) == ("native", None)


@DECODED_GEMMS
def test_decoded_matmul_recomputes_values_bf16_does_not_hold(gemm):
    gen = torch.Generator().manual_seed(4)
    # block scales near 2**-133: elements below bf16's normal range (a bf16 cast would round them)
    a, b = torch.randn(48, 128, generator=gen) * 2.0**-125, torch.randn(128, 40, generator=gen)
    qa, qb = quantize_ref(a, "mxfp8", 1), quantize_ref(b, "mxfp8", 0)
    oa, ob = as_operand(to_device(qa, DEVICE), 1, "a"), as_operand(to_device(qb, DEVICE), 0, "b")
    flag = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    assert not torch.equal(decode_bf16(oa, flag).float().cpu(), dequantize_ref(qa))
    assert flag.item() == 1
    want = dispatch.reference_scaled_mm(qa, qb, None, torch.float32)
    for out_dtype in (torch.float32, torch.bfloat16):
        got = gemm(oa, ob, None, out_dtype).cpu().float()
        tol = 1e-5 if out_dtype == torch.float32 else 2**-8
        assert torch.allclose(got, want, rtol=tol, atol=tol * want.abs().max().item())


def test_decode_flags_only_values_bf16_does_not_hold():
    """Zero blocks (E8M0 scale 2**-127), normal data and NVFP4 leave the flag clear; the same kernel's GEMM
    programs then return at once and leave the product as cuBLAS wrote it; once set, its persistent grid (4
    programs in the interpreter) computes all 8 output tiles."""
    x = torch.randn(64, 64)
    x[:, :32] = 0.0
    flag = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    for fmt in ("mxfp8", "mxfp8_e5m2", "nvfp4"):
        decode_bf16(as_operand(to_device(quantize_ref(x, fmt, 1), DEVICE), 1, "a"), flag)
    assert flag.item() == 0
    oa = as_operand(to_device(quantize_ref(x, "mxfp8", 1), DEVICE), 1, "a")
    ob = as_operand(to_device(quantize_ref(torch.randn(64, 64), "mxfp8", 0), DEVICE), 0, "b")
    out = torch.full((64, 64), 7.0, device=DEVICE)
    launch((32, 16, 32), oa, ob, None, torch.float32, DOT_FP32, out=out, flag=flag)
    assert (out == 7.0).all()
    flag.fill_(1)
    launch((32, 16, 32), oa, ob, None, torch.float32, DOT_FP32, out=out, flag=flag)
    assert torch.equal(out, launch((32, 16, 32), oa, ob, None, torch.float32, DOT_FP32))


@pytest.mark.parametrize("fmt,axis", [("nvfp4", 1), ("nvfp4", 0), ("mxfp8", 1), ("mxfp8_e5m2", 0)])
def test_step_read_on_the_device_draws_the_streams_bits(fmt, axis):
    """A ``StepStream`` (the model's call counter as a tensor, as compiled graphs pass it) gives the bytes of
    the stream ``sr_stream(seed, step)`` given as an int, the step's low word read by the kernel."""
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    for seed, step in ((3, 7), (2**31 - 5, 2**32 + 9)):
        stream = StepStream(seed, torch.tensor(step, device=DEVICE))
        got = quantize_triton(x, get_format(fmt), axis, seed=stream, rht=fmt == "nvfp4")
        want = quantize_triton(x, get_format(fmt), axis, seed=sr_stream(seed, step), rht=fmt == "nvfp4")
        assert int(stream) == sr_stream(seed, step)
        assert all(bits_equal(getattr(got, f), getattr(want, f)) for f in ("codes", "scales"))


def test_sr_quantize_op_reads_no_step_on_the_host(monkeypatch):
    """The graph's quantize op hands the step tensor to the Triton kernel rather than reading it."""
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    x, step = torch.randn(64, 64).to(DEVICE), torch.tensor(11, device=DEVICE)
    op = torch.ops.autoprec.quantize.default
    op(x, "nvfp4", 0, "sr", 3, False, "rceil", True, 0, step)  # compiled outside the check
    with HostReads() as rec:
        op(x, "nvfp4", 0, "sr", 3, False, "rceil", True, 0, step)
    assert rec.found == []
