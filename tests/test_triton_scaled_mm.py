"""Triton block-scaled matmul against the reference qmm (fp32 accumulation tolerance) and torch (bf16)."""
import pytest
import torch

pytest.importorskip("triton")

from autoprec.formats import get_format
from autoprec.kernels import dequantize_ref, qmm_ref, quantize_ref
from autoprec.kernels.core.operand import KIND_BF16, as_operand
from autoprec.kernels.core.quantized import QuantizedTensor
from autoprec.kernels.reference.rounding import e2m1_decode, e8m0_decode, unpack_nibbles
from autoprec.kernels.triton import scaled_mm_decoded as decoded_module
from autoprec.kernels.triton.scaled_mm import DOT_FP32, launch, scaled_mm_triton
from autoprec.kernels.triton.scaled_mm_decoded import (
    decode_bf16,
    scaled_mm_decoded,
    scaled_mm_decoded_tma,
    scaled_mm_decoded_triton,
)
from autoprec.kernels.triton.scaled_mm_tc import scaled_mm_tc_triton

from helpers import RecordedKernel, bits_equal, to_device

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = [("nvfp4", "nvfp4", False), ("nvfp4", "nvfp4", True), ("mxfp8", "mxfp8", False),
         ("mxfp8", "mxfp8_e5m2", False), ("mxfp8_e5m2", "nvfp4", True)]


@pytest.fixture(params=[scaled_mm_triton, scaled_mm_tc_triton, scaled_mm_decoded, scaled_mm_decoded_triton,
                        scaled_mm_decoded_tma],
                ids=["fp32_dot", "sm90_bf16_tensor_core", "sm90_decoded_cublas", "sm90_decoded_triton",
                     "sm90_decoded_tma"])
def kernel(request):
    """The Triton matmuls (tiles decoded to fp32 with an fp32 dot, or to bf16 for tensor cores) and the
    operands decoded to bf16 in memory for a library GEMM or Triton's (tiles loaded by pointers, or by the TMA)."""
    return request.param


def run(kernel, a, b, bias=None, out_dtype=torch.float32):
    bias = None if bias is None else bias.to(DEVICE)
    return kernel(as_operand(a, 1, "a"), as_operand(b, 0, "b"), bias, out_dtype).cpu()


@pytest.mark.parametrize("fa,fb,tile2d", CASES, ids=[f"{a}x{b}{'-16x16' if t else ''}" for a, b, t in CASES])
def test_matches_reference_qmm(kernel, fa, fb, tile2d):
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(40, 128, generator=gen), torch.randn(128, 48, generator=gen)  # M, N not tile multiples
    qa = quantize_ref(a, fa, 1)
    qb = quantize_ref(b, fb, 0, tile2d=True) if tile2d else quantize_ref(b, fb, 0)
    want = qmm_ref(a, b, fa, fb, tile2d_b=tile2d)
    got = run(kernel, to_device(qa, DEVICE), to_device(qb, DEVICE))
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_bias_and_bf16_output(kernel):
    a, b, bias = torch.randn(32, 64), torch.randn(64, 32), torch.randn(32)
    qa, qb = quantize_ref(a, "mxfp8", 1), quantize_ref(b, "nvfp4", 0)
    want = dequantize_ref(qa) @ dequantize_ref(qb) + bias
    got = run(kernel, to_device(qa, DEVICE), to_device(qb, DEVICE), bias, torch.bfloat16)
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), want, rtol=2**-8, atol=1e-3)


def test_bf16_equals_torch(kernel):
    gen = torch.Generator().manual_seed(1)
    # small integers: every partial sum is exact, so any accumulation order gives torch's result
    a = torch.randint(-8, 8, (40, 96), generator=gen).to(torch.bfloat16)
    b = torch.randint(-8, 8, (96, 48), generator=gen).to(torch.bfloat16)
    bias = torch.randint(-4, 4, (48,), generator=gen).to(torch.bfloat16)
    assert torch.equal(run(kernel, a.to(DEVICE), b.to(DEVICE), None, torch.bfloat16), a @ b)
    want = torch.nn.functional.linear(a, b.t(), bias)
    assert torch.equal(run(kernel, a.to(DEVICE), b.to(DEVICE), bias, torch.bfloat16), want)
    x, w = torch.randn(32, 64, generator=gen).bfloat16(), torch.randn(64, 32, generator=gen).bfloat16()
    got = run(kernel, x.to(DEVICE), w.to(DEVICE), None, torch.bfloat16)
    assert torch.allclose(got.float(), (x @ w).float(), rtol=2**-7)


def test_programs_cover_every_output_tile():
    """The kernel's programs run in bands of GROUP_M tile rows down each tile column: on a grid of 10 x 3 tiles (a
    full band and a partial one) every tile of an output filled with NaN first is written, as the reference."""
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(300, 64, generator=gen), torch.randn(64, 70, generator=gen)
    qa, qb = quantize_ref(a, "mxfp8", 1), quantize_ref(b, "mxfp8", 0)
    out = torch.full((300, 70), float("nan"), device=DEVICE)
    launch((32, 32, 64), as_operand(to_device(qa, DEVICE), 1, "a"), as_operand(to_device(qb, DEVICE), 0, "b"), None,
           torch.float32, DOT_FP32, out=out)
    want = qmm_ref(a, b, "mxfp8", "mxfp8")
    assert torch.allclose(out.cpu(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_nan_block_propagates(kernel):
    a = torch.randn(32, 64)
    a[5, 3] = float("nan")
    qa, qb = quantize_ref(a, "nvfp4", 1), quantize_ref(torch.randn(64, 32), "nvfp4", 0)
    got = run(kernel, to_device(qa, DEVICE), to_device(qb, DEVICE))
    assert torch.isnan(got[5]).all() and torch.isfinite(got[[0, 1, 2, 4]]).all()


@pytest.mark.parametrize("fmt,out_dtype", [("nvfp4", torch.float32), ("nvfp4", torch.bfloat16),
                                           ("mxfp8", torch.float32), ("mxfp8", torch.bfloat16)])
def test_sm90_tma_gemm_equals_the_pointer_gemm_at_the_same_tiles(fmt, out_dtype):
    """Triton's GEMM over decoded operands with its tiles read through tensor descriptors (the TMA) is, at the same
    tiles (so the same accumulation order), bit for bit the one reading them by pointers: M, N and K (96, two 64-wide
    K tiles) all end in partial tiles, which the descriptors fill with zeros where the pointer loads mask; with
    NVFP4's tensor scales and a bias."""
    gen = torch.Generator().manual_seed(3)
    x, w, bias = torch.randn(72, 96, generator=gen), torch.randn(96, 40, generator=gen), torch.randn(40, generator=gen)
    a = as_operand(to_device(quantize_ref(x, fmt, 1), DEVICE), 1, "a")
    b = as_operand(to_device(quantize_ref(w, fmt, 0), DEVICE), 0, "b")
    bias = bias.to(DEVICE)
    tiles = dict(blocks=(32, 32, 64), num_warps=4, num_stages=2)
    want = scaled_mm_decoded_triton(a, b, bias, out_dtype, **tiles)
    assert torch.equal(scaled_mm_decoded_tma(a, b, bias, out_dtype, **tiles), want)
    assert torch.allclose(want.float().cpu(), qmm_ref(x, w, fmt, fmt) + bias.cpu(), rtol=2**-7, atol=1e-4)


@pytest.mark.parametrize("fmt,tile_rows", [("nvfp4", 1), ("nvfp4", 16), ("mxfp8", 1), ("mxfp8_e5m2", 1)])
def test_sm90_decode_is_exact_code_times_block_scale(fmt, tile_rows):
    """The decoded path's decode on raw codes and scales (every E2M1 / FP8 code, E4M3 scales down to
    subnormals and NaN, E8M0 scales across bf16's normal range), 80 x 208 (partial tiles both ways): bit for
    bit the fp32 product of each code's value and its block scale (NVFP4's tensor scale left out)."""
    gen = torch.Generator().manual_seed(9)
    f = get_format(fmt)
    rows, k = 80, 208 if fmt == "nvfp4" else 224
    if fmt == "nvfp4":
        codes = torch.randint(0, 256, (rows, k // 2), generator=gen, dtype=torch.uint8)
        scales = torch.randint(0, 256, (-(-rows // tile_rows), k // 16), generator=gen, dtype=torch.uint8)
        values = e2m1_decode(unpack_nibbles(codes))
        block = scales.view(torch.float8_e4m3fn).float().repeat_interleave(tile_rows, 0)[:rows]
    else:
        codes = torch.randint(0, 256, (rows, k), generator=gen, dtype=torch.uint8).view(f.elem.torch_dtype)
        scales = torch.randint(127 - 100, 127 + 100, (rows, k // 32), generator=gen, dtype=torch.uint8)
        values, block = codes.float(), e8m0_decode(scales)
    want = values * block.repeat_interleave(f.block_size, 1)
    ts = torch.ones((), dtype=torch.float32) if fmt == "nvfp4" else None
    q = QuantizedTensor(f, codes, scales.view(torch.float8_e4m3fn) if fmt == "nvfp4" else scales, ts, 1,
                        torch.Size((rows, k)), tile_rows)
    got = decode_bf16(as_operand(to_device(q, DEVICE), 1, "a")).float().cpu()
    same = (got == want) | (got.isnan() & want.isnan())
    assert same.all(), (got[~same][:5], want[~same][:5])


@pytest.mark.parametrize("fmt_a,fmt_b,tile_rows", [("nvfp4", "nvfp4", 1), ("mxfp8", "mxfp8", 1), ("nvfp4", "nvfp4", 16),
                                                    ("mxfp8_e5m2", "mxfp8", 1), ("mxfp8", "nvfp4", 16),
                                                    ("bf16", "mxfp8", 1)])
def test_sm90_decode_pair_is_one_launch_of_each_operands_decode(monkeypatch, fmt_a, fmt_b, tile_rows):
    """``decode_pair`` decodes A (150 rows) and B (48 rows: fewer row tiles, partial ones) in one launch, formats
    alike (one body) or apart (16x16 tiles too: a branch each), each bit for bit its own ``decode_bf16``; a bf16
    operand is its values, not decoded. The flag is set by an MXFP8 operand's values bf16 does not hold, whichever
    side it is on."""
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(150, 96, generator=gen), torch.randn(96, 48, generator=gen)
    b[:, 7] *= 2.0**-126  # a block of B's whose MXFP8 values sit below bf16's normal range
    ops = []
    for x, fmt, axis, name in ((a, fmt_a, 1, "a"), (b, fmt_b, 0, "b")):
        tile2d = tile_rows == 16 and fmt == "nvfp4" and name == "b"
        q = x.bfloat16().to(DEVICE) if fmt == "bf16" else to_device(quantize_ref(x, fmt, axis, tile2d=tile2d), DEVICE)
        ops.append(as_operand(q, axis, name))
    launches = []
    kernel = decoded_module._decode_kernel
    monkeypatch.setattr(decoded_module, "_decode_kernel", RecordedKernel(kernel, launches))
    flag = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    da, db = decoded_module.decode_pair(*ops, flag)
    assert len(launches) == 1
    assert flag.item() == int(fmt_b == "mxfp8")
    for op, got in zip(ops, (da, db)):
        want = op.codes if op.kind == KIND_BF16 else decode_bf16(op)
        assert got.dtype == torch.bfloat16 and bits_equal(got.cpu(), want.cpu())
    assert (da is ops[0].codes) == (fmt_a == "bf16")


@pytest.fixture
def bf16_reduction(request):
    """torch's (``allow_bf16_reduced_precision_reduction``, its split-K setting) set to ``request.param`` for a test
    and restored after (not by monkeypatch: pytest 9.2's cannot put back an attribute torch serves through
    ``__getattr__``)."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_bf16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction_split_k
    matmul.allow_bf16_reduced_precision_reduction = request.param
    yield request.param
    matmul.allow_bf16_reduced_precision_reduction = saved


@pytest.mark.parametrize("bf16_reduction", [(True, True), (False, True), (False, False)],
                         ids=["torch_default", "bf16_sums_off", "split_k_off"], indirect=True)
def test_decoded_mxfp8_to_bf16_is_cublas_rounding_its_fp32_sums(monkeypatch, bf16_reduction):
    """An MXFP8 product to bf16 (without bias, or with a bf16 one) takes cuBLAS's own rounding of its fp32
    accumulator plus the bias (no fp32 product in memory, no epilogue launch) whatever torch's
    ``allow_bf16_reduced_precision_reduction``: the decoded path turns it off around its GEMM
    (``fp32_split_k_sums``, which keeps the split-K setting and restores the flag, after an error too), so cuBLAS
    adds split-K partial sums in fp32 as the reference does. It equals the reference to bf16's rounding; an fp32
    bias takes the epilogue."""
    matmul = torch.backends.cuda.matmul
    with decoded_module.fp32_split_k_sums():
        assert not matmul.allow_bf16_reduced_precision_reduction
        assert matmul.allow_bf16_reduced_precision_reduction_split_k == bf16_reduction[1]
    with pytest.raises(RuntimeError, match="inside"), decoded_module.fp32_split_k_sums():
        raise RuntimeError("inside")
    assert (matmul.allow_bf16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction_split_k
            ) == bf16_reduction
    launches = []
    epilogue = decoded_module._epilogue_kernel
    monkeypatch.setattr(decoded_module, "_epilogue_kernel", RecordedKernel(epilogue, launches))
    gen = torch.Generator().manual_seed(6)
    a, b = torch.randn(48, 96, generator=gen), torch.randn(96, 40, generator=gen)
    qa, qb = quantize_ref(a, "mxfp8", 1), quantize_ref(b, "mxfp8", 0)
    oa, ob = as_operand(to_device(qa, DEVICE), 1, "a"), as_operand(to_device(qb, DEVICE), 0, "b")
    bias = torch.randn(40, generator=gen).bfloat16()
    for add in (None, bias, bias.float()):
        got = decoded_module.scaled_mm_decoded_cublas(oa, ob, None if add is None else add.to(DEVICE),
                                                      torch.bfloat16).float().cpu()
        want = qmm_ref(a, b, "mxfp8", "mxfp8") + (0.0 if add is None else add.float())
        assert torch.allclose(got, want, rtol=2**-8, atol=2**-8 * want.abs().max().item())
    assert len(launches) == 1  # the fp32 bias's


def test_decoded_fp32_out_takes_the_epilogue_only_for_tensor_scales_or_a_bias(monkeypatch):
    """An fp32 product with no NVFP4 tensor scale and no bias (an fp32 model's MXFP8 or bf16 GEMMs) is cuBLAS's fp32
    accumulator as it stands: no epilogue launch to copy it. NVFP4 operands (their tensor scales) and a bias (added
    in fp32) take the epilogue. Every case equals the reference to fp32 accumulation order."""
    launches = []
    monkeypatch.setattr(decoded_module, "_epilogue_kernel", RecordedKernel(decoded_module._epilogue_kernel, launches))
    gen = torch.Generator().manual_seed(7)
    a, b = torch.randn(40, 96, generator=gen), torch.randn(96, 24, generator=gen)
    bias = torch.randn(24, generator=gen)
    for fmt, add, epilogues in (("mxfp8", None, 0), ("bf16", None, 0), ("mxfp8", bias, 1), ("nvfp4", None, 1)):
        launches.clear()
        if fmt == "bf16":
            qa, qb, want = a.bfloat16(), b.bfloat16(), a.bfloat16().float() @ b.bfloat16().float()
        else:
            qa, qb, want = quantize_ref(a, fmt, 1), quantize_ref(b, fmt, 0), qmm_ref(a, b, fmt, fmt)
        qa, qb = (q.to(DEVICE) if fmt == "bf16" else to_device(q, DEVICE) for q in (qa, qb))
        oa, ob = as_operand(qa, 1, "a"), as_operand(qb, 0, "b")
        got = decoded_module.scaled_mm_decoded_cublas(oa, ob, None if add is None else add.to(DEVICE), torch.float32)
        want = want if add is None else want + add
        assert got.dtype == torch.float32 and len(launches) == epilogues, fmt
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
