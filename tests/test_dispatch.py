"""Kernel dispatch: AUTOPREC_KERNELS modes, supports() reasons, and the torch.library ops."""
import pytest
import torch

from autoprec.kernels import (
    ops,  # noqa: F401  (registers torch.ops.autoprec)
    qmm_ref,
    quantize_ref,
)
from autoprec.kernels.core import launch
from autoprec.kernels.dispatch import dense as dispatch

from helpers import bits_equal

STEP = torch.tensor(1)  # the model's call counter, an input of every quantize op


def test_mode_selection(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(launch, "INTERPRET", True)
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    assert dispatch.use_triton(cpu, None) is False
    monkeypatch.setenv("AUTOPREC_KERNELS", "auto")
    assert dispatch.use_triton(cpu, None) is False  # auto: the reference on CPU, Triton on CUDA
    monkeypatch.delenv("AUTOPREC_KERNELS")
    assert dispatch.kernel_mode() == "auto"
    if dispatch.triton_runtime_reason(cpu) is None:
        monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
        assert dispatch.use_triton(cpu, None) is True


def test_hardware_conversions_on_cuda_from_sm89_and_sm100_never_interpreted(monkeypatch):
    """The quantizers round to nearest with the GPU's conversions on a CUDA device: MXFP8 and NVFP4's block scales
    from sm_89 on (Ada, Hopper, Blackwell), NVFP4's elements from sm_100 on (Blackwell); elsewhere in integer
    arithmetic, and always in the interpreter (whose casts round wrongly)."""
    caps = {0: (8, 0), 1: (8, 9), 2: (9, 0), 3: (10, 0), 4: (12, 0)}
    monkeypatch.setattr(launch, "_capability", caps.__getitem__)
    monkeypatch.setattr(launch, "INTERPRET", False)
    cuda = [torch.device("cuda", i) for i in caps]
    assert [launch.hardware_fp8(d) for d in cuda] == [False, True, True, True, True]
    assert [launch.hardware_fp4(d) for d in cuda] == [False, False, False, True, True]
    assert [launch.nvfp4_hardware(d) for d in cuda] == [0, 1, 1, 2, 2]
    assert not launch.hardware_fp8(torch.device("cpu")) and not launch.hardware_fp4(torch.device("cpu"))
    assert launch.nvfp4_hardware(torch.device("cpu")) == 0
    monkeypatch.setattr(launch, "INTERPRET", True)
    assert not launch.hardware_fp8(cuda[2]) and not launch.hardware_fp4(cuda[3])
    assert launch.nvfp4_hardware(cuda[3]) == 0


def test_rht_option_equals_transform_then_quantize(monkeypatch):
    from autoprec.kernels import rht_ref

    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    x = torch.randn(32, 64)
    assert bits_equal(dispatch.quantize(x, "mxfp8", 0, rht=True).codes, quantize_ref(rht_ref(x, 0), "mxfp8", 0).codes)


def test_forced_triton_matches_ref(monkeypatch):
    pytest.importorskip("triton")
    x, w = torch.randn(32, 64), torch.randn(64, 32)
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    qa, qb = dispatch.quantize(x, "nvfp4", 1, rounding="sr", seed=2), dispatch.quantize(w, "mxfp8", 0)
    y = dispatch.scaled_mm(qa, qb)
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    ra, rb = dispatch.quantize(x, "nvfp4", 1, rounding="sr", seed=2), dispatch.quantize(w, "mxfp8", 0)
    assert bits_equal(qa.codes, ra.codes) and bits_equal(qb.scales, rb.scales)
    assert torch.allclose(y, dispatch.scaled_mm(ra, rb), rtol=1e-5, atol=1e-4)


def test_float16_output_is_the_kernels_fp32_product_rounded_once(monkeypatch):
    """The kernels write fp32 or bf16: an fp16 output (an fp16 model's GEMMs) runs the kernel into fp32 and rounds
    once, as the reference does, instead of leaving the kernels."""
    pytest.importorskip("triton")
    qa, qb = dispatch.quantize(torch.randn(32, 64), "nvfp4", 1), dispatch.quantize(torch.randn(64, 32), "nvfp4", 0)
    bias = torch.randn(32)
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    y = dispatch.scaled_mm(qa, qb, bias, torch.float16)
    assert y.dtype == torch.float16 and torch.equal(y, dispatch.scaled_mm(qa, qb, bias, torch.float32).half())
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    torch.testing.assert_close(y, dispatch.scaled_mm(qa, qb, bias, torch.float16), rtol=2**-10, atol=1e-3)


def test_forced_triton_says_why_not(monkeypatch):
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    with pytest.raises(ValueError, match="cannot run: dtype torch.float64"):
        dispatch.quantize(torch.randn(16, 32, dtype=torch.float64), "nvfp4")
    qa = quantize_ref(torch.randn(16, 32), "nvfp4")
    with pytest.raises(ValueError, match="cannot run: an empty operand"):
        dispatch.scaled_mm(qa, quantize_ref(torch.randn(32, 0), "nvfp4", 0))
    monkeypatch.setattr(launch, "INTERPRET", False)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
            dispatch.quantize(torch.randn(16, 32), "nvfp4")


def test_bad_mode(monkeypatch):
    monkeypatch.setenv("AUTOPREC_KERNELS", "cuda")
    with pytest.raises(ValueError, match="AUTOPREC_KERNELS='cuda'.*auto, triton, ref"):
        dispatch.quantize(torch.randn(16, 32), "nvfp4")


def test_scaled_mm_checks_operands():
    qa = quantize_ref(torch.randn(16, 32), "nvfp4")
    with pytest.raises(ValueError, match="operand b must be 2D and blocked along its reduction dim 0"):
        dispatch.scaled_mm(qa, quantize_ref(torch.randn(16, 32), "nvfp4", 1))
    with pytest.raises(ValueError, match="reduction dims differ"):
        dispatch.scaled_mm(qa, quantize_ref(torch.randn(64, 16), "nvfp4", 0))
    with pytest.raises(TypeError, match="operand a must be a QuantizedTensor or a 2D bfloat16"):
        dispatch.scaled_mm(torch.randn(16, 32), quantize_ref(torch.randn(32, 16), "nvfp4", 0))


def test_custom_ops_pass_opcheck():
    x = torch.randn(32, 64)
    torch.library.opcheck(torch.ops.autoprec.quantize.default, (x, "nvfp4", 1, "rne", 0, True, "rceil", False, 0, STEP))
    torch.library.opcheck(torch.ops.autoprec.quantize.default, (x, "mxfp8", 0, "sr", 3, False, "floor", True, 0, STEP))
    c, s, t = torch.ops.autoprec.quantize(x, "nvfp4", 0, "rne", 0, False, "rceil", False, 0, STEP)
    torch.library.opcheck(torch.ops.autoprec.dequantize.default, (c, s, t, "nvfp4", 0, [32, 64], 1))
    w = torch.randn(48, 64)
    wc, ws, wt = torch.ops.autoprec.quantize(w, "nvfp4", 1, "rne", 0, False, "rceil", False, 0, STEP)
    a = torch.randn(8, 64).bfloat16()  # a bf16 operand: its values as codes, any tensor as scales
    args = (a, a, t, "bf16", wc, ws, wt, "nvfp4", 1, torch.randn(48), torch.float32)
    torch.library.opcheck(torch.ops.autoprec.scaled_mm.default, args)
    dual = (x, "nvfp4", "sr", 1, False, False, "sr", 2, True, True, "rceil", 0, STEP)
    torch.library.opcheck(torch.ops.autoprec.quantize_dual.default, dual)
    amax = x.abs().max().view(torch.int32)  # the graph's amax bits (passes/graph_amax.py)
    torch.library.opcheck(torch.ops.autoprec.quantize.default, (x, "nvfp4", 1, "sr", 3, False, "rceil", False, 0, STEP,
                                                                amax))
    dual = (x, "nvfp4", "rne", 0, False, False, "sr", 2, False, True, "rceil", 0, STEP, amax)
    torch.library.opcheck(torch.ops.autoprec.quantize_dual.default, dual)
    dual = (x, "mxfp8", "rne", 0, False, True, "sr", 2, False, False, "floor", 0, STEP)
    torch.library.opcheck(torch.ops.autoprec.quantize_dual.default, dual)
    tc, ts, _ = torch.ops.autoprec.quantize(x, "nvfp4", 1, "rne", 0, True, "rceil", False, 0, STEP)
    torch.library.opcheck(torch.ops.autoprec.transpose_tiles.default, (tc, ts))
    grouped = (torch.randn(10, 64), torch.randn(3, 64, 16), torch.tensor([3, 3, 10], dtype=torch.int32), "nvfp4",
               "rne", "sr", False, False, 1, 2, "rceil", 0, STEP, torch.float32)
    torch.library.opcheck(torch.ops.autoprec.grouped_mm.default, grouped)
    torch.library.opcheck(torch.ops.autoprec.grouped_mm_on_device.default, grouped)


def test_mxfp8_parts_have_no_tensor_scale():
    """MXFP8 has no tensor scale: the ops' third part is an empty tensor (no fill launch on a GPU), and the
    quantization it belongs to still dequantizes and multiplies as the reference's."""
    x, w = torch.randn(32, 64), torch.randn(48, 64)
    c, s, t = torch.ops.autoprec.quantize(x, "mxfp8", 1, "rne", 0, False, "floor", False, 0, STEP)
    assert t.dtype == torch.float32 and t.shape == (0,)
    parts = torch.ops.autoprec.quantize_dual(x, "mxfp8", "rne", 0, False, False, "rne", 0, False, False, "floor", 0,
                                             STEP)
    assert parts[2].shape == (0,) and parts[5].shape == (0,)
    assert bits_equal(torch.ops.autoprec.dequantize(c, s, t, "mxfp8", 1, [32, 64], 1),
                      dispatch.dequantize(dispatch.quantize(x, "mxfp8", 1, scale_mode="floor")))
    wc, ws, wt = torch.ops.autoprec.quantize(w, "mxfp8", 1, "rne", 0, False, "floor", False, 0, STEP)
    y = torch.ops.autoprec.scaled_mm(c, s, t, "mxfp8", wc, ws, wt, "mxfp8", 1, None, torch.float32)
    assert torch.allclose(y, qmm_ref(x, w.t(), "mxfp8", "mxfp8", scale_mode="floor"), atol=1e-4)


def test_ops_trace_under_compile():
    def f(x, w):
        ac, as_, at = torch.ops.autoprec.quantize(x, "nvfp4", 1, "rne", 0, False, "rceil", False, 0, STEP)
        bc, bs, bt = torch.ops.autoprec.quantize(w, "nvfp4", 1, "rne", 0, True, "rceil", False, 0, STEP)
        return torch.ops.autoprec.scaled_mm(ac, as_, at, "nvfp4", bc, bs, bt, "nvfp4", 16, None, torch.float32)

    x, w = torch.randn(32, 64), torch.randn(48, 64)
    y = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w)
    assert bits_equal(y, f(x, w))
    assert torch.allclose(y, qmm_ref(x, w.t(), "nvfp4", "nvfp4", tile2d_b=True), atol=1e-4)
