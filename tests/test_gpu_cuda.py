"""On a CUDA GPU only (skipped elsewhere; CI has none): the matmul paths dispatch runs there against the CPU
references to fp32 accumulation order, grouped (experts) products, no waits for the GPU, and compiled training
steps against the same steps on the CPU (the quantizers: tests/test_gpu_quantize.py)."""
import pytest
import torch

import autoprec
from autoprec.kernels import quantize_ref
from autoprec.kernels.core.operand import as_operand
from autoprec.kernels.core.random_bits import sr_stream
from autoprec.kernels.cuda.scaled_mm_blockwise import blockwise_problem
from autoprec.kernels.dispatch import dense as dispatch
from autoprec.kernels.dispatch import grouped as grouped_dispatch
from autoprec.kernels.dispatch.grouped_mm import grouped_mm
from autoprec.kernels.dispatch.grouped_route import grouped_route
from autoprec.kernels.triton import gemm_choice
from autoprec.kernels.triton.scaled_mm_decoded import scaled_mm_decoded, scaled_mm_decoded_triton
from autoprec.planner.cost import device_note

from gpt_model import TinyGPT, tokens
from helpers import amax_edge_case, stored_amax_bits, to_device, with_amax_bits

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def assert_matches_reference(got: torch.Tensor, want: torch.Tensor, out_dtype: torch.dtype) -> None:
    """A GPU product in ``out_dtype`` equals the reference's fp32 one up to accumulation order (and bf16's rounding)."""
    tol = 2**-8 if out_dtype == torch.bfloat16 else 1e-5
    assert got.dtype == out_dtype
    assert torch.allclose(got.float(), want, rtol=tol, atol=tol * want.abs().max().item())


@pytest.mark.parametrize("fa,fb", [("nvfp4", "nvfp4"), ("mxfp8", "mxfp8"), ("mxfp8", "nvfp4"), ("mxfp8", "mxfp8_e5m2")])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16, None], ids=["fp32_bias", "bf16_bias", "no_bias"])
def test_gpu_matmul_matches_reference(monkeypatch, fa, fb, out_dtype, bias_dtype):
    """MXFP8 to bf16 without an fp32 bias is cuBLAS rounding its own accumulator (bf16 bias added in fp32)."""
    gen = torch.Generator().manual_seed(2)
    a, b, bias = torch.randn(300, 1024, generator=gen), torch.randn(1024, 200, generator=gen), torch.randn(200)
    bias = None if bias_dtype is None else bias.to(bias_dtype)
    qa, qb = quantize_ref(a, fa, 1), quantize_ref(b, fb, 0)
    capability = torch.cuda.get_device_capability()
    ga, gb = to_device(qa, "cuda"), to_device(qb, "cuda")
    path, _ = dispatch.gemm_path(capability, as_operand(ga, 1, "a"), as_operand(gb, 0, "b"))
    assert path == ("native" if capability >= (10, 0) and fa[:5] == fb[:5] else "decoded")
    got = dispatch.scaled_mm(ga, gb, None if bias is None else bias.cuda(), out_dtype).cpu()
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    want = dispatch.scaled_mm(qa, qb, bias, torch.float32)
    assert_matches_reference(got, want, out_dtype)


@pytest.mark.parametrize("tiles", [(False, True), (False, False), (True, False)], ids=["1x128.128x128",
                                                                                     "1x128.1x128", "128x128.1x128"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_gpu_fp8_block_matmul_matches_reference(monkeypatch, tiles, out_dtype):
    """FP8-block on sm_90: cuBLAS's blockwise GEMM (the reference product on any other GPU), bias in fp32."""
    gen = torch.Generator().manual_seed(3)
    a, b, bias = torch.randn(384, 640, generator=gen), torch.randn(640, 256, generator=gen), torch.randn(256)
    qa, qb = quantize_ref(a, "fp8_block", 1, tile2d=tiles[0]), quantize_ref(b, "fp8_block", 0, tile2d=tiles[1])
    ga, gb = to_device(qa, "cuda"), to_device(qb, "cuda")
    why = blockwise_problem(torch.cuda.get_device_capability(), as_operand(ga, 1, "a"), as_operand(gb, 0, "b"))
    assert (why is None) == (torch.cuda.get_device_capability()[0] == 9), why
    got = dispatch.scaled_mm(ga, gb, bias.cuda(), out_dtype).cpu()
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    assert_matches_reference(got, dispatch.scaled_mm(qa, qb, bias, torch.float32), out_dtype)


@pytest.mark.parametrize("fa,fb", [("nvfp4", "nvfp4"), ("mxfp8", "mxfp8"), ("mxfp8", "nvfp4")])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_gpu_triton_gemm_over_decoded_operands_matches_reference(fa, fb, out_dtype):
    """``scaled_mm_decoded_triton`` (the decoded path's product where it times faster than cuBLAS's) on the GPU:
    bias, tensor scales and the rounding in its registers, 16 pipelined K steps, edge tiles in M and N."""
    gen = torch.Generator().manual_seed(2)
    a, b, bias = torch.randn(300, 1024, generator=gen), torch.randn(1024, 208, generator=gen), torch.randn(208)
    qa, qb = quantize_ref(a, fa, 1), quantize_ref(b, fb, 0, tile2d=fb == "nvfp4")
    oa, ob = as_operand(to_device(qa, "cuda"), 1, "a"), as_operand(to_device(qb, "cuda"), 0, "b")
    got = scaled_mm_decoded_triton(oa, ob, bias.cuda(), out_dtype).cpu()
    want = dispatch.reference_scaled_mm(qa, qb, bias, torch.float32)
    assert_matches_reference(got, want, out_dtype)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_gpu_decoded_gemm_times_both_products_once_then_runs_the_faster(monkeypatch, tmp_path, fmt):
    """On this GPU: a new key times cuBLAS's and Triton's products (each close to the reference), keeps the faster
    in memory and in Triton's cache directory, and later calls run it without timing again."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(gemm_choice.ENV, raising=False)
    monkeypatch.setattr(gemm_choice, "_CHOSEN", {})
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(1024, 2048, generator=gen), torch.randn(2048, 1024, generator=gen)
    qa, qb = quantize_ref(a, fmt, 1), quantize_ref(b, fmt, 0)
    oa, ob = as_operand(to_device(qa, "cuda"), 1, "a"), as_operand(to_device(qb, "cuda"), 0, "b")
    want = dispatch.reference_scaled_mm(qa, qb, None, torch.float32)
    got = scaled_mm_decoded(oa, ob, None, torch.bfloat16)
    (name,) = gemm_choice.chosen().values()
    assert name in gemm_choice.PRODUCTS and len(list(tmp_path.rglob("decoded_gemm.json"))) == 1
    monkeypatch.setattr(gemm_choice, "short_bench", lambda fn: pytest.fail("timed a key twice"))
    again = scaled_mm_decoded(oa, ob, None, torch.bfloat16)
    assert torch.equal(got, again)
    assert_matches_reference(got.cpu(), want, torch.bfloat16)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8", None])
def test_gpu_batched_matmul_is_one_gemm_matching_reference(monkeypatch, fmt):
    """A planned bmm's product (16 attention heads' scores) on the GPU: one grouped GEMM (bf16: one batched matmul),
    not one per head, against the reference's fp32 batched matmul."""
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(16, 300, 128, generator=gen), torch.randn(16, 128, 320, generator=gen)
    qa, qb = (a.bfloat16(), b.bfloat16()) if fmt is None else (quantize_ref(a, fmt, 2), quantize_ref(b, fmt, 1))
    dense = []
    real = dispatch.scaled_mm
    monkeypatch.setattr(dispatch, "scaled_mm", lambda *args: dense.append(1) or real(*args))
    gpu = (lambda x: x.cuda()) if fmt is None else (lambda q: to_device(q, "cuda"))
    got = dispatch.scaled_mm(gpu(qa), gpu(qb), None, torch.bfloat16).cpu()
    assert len(dense) == 1, "no dense GEMM per batch item"
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    want = real(qa, qb, None, torch.float32)
    torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=2**-8 * want.abs().max().item())


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8", "bf16"])
def test_gpu_batch_of_experts_is_one_grouped_gemm_matching_reference(monkeypatch, fmt):
    """A 3d x 3d grouped product (6 experts of 200 tokens each, no offsets) on the GPU: quantized, the experts route
    (one grouped GEMM, no dense GEMM per item); bf16, torch's or Triton's grouped GEMM; against the reference's
    per-item loop."""
    gen = torch.Generator().manual_seed(8)
    a, w = torch.randn(6, 200, 256, generator=gen), torch.randn(6, 256, 192, generator=gen) * 0.02
    args = dict(rounding_a="sr", seeds=(3, 4), step=1, out_dtype=torch.bfloat16)
    dense = []
    real = dispatch.scaled_mm
    monkeypatch.setattr(dispatch, "scaled_mm", lambda *args: dense.append(1) or real(*args))
    got = grouped_mm(a.cuda(), w.cuda(), None, fmt, **args).cpu()
    assert dense == [], "no dense GEMM per batch item"
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    want = grouped_mm(a, w, None, fmt, **args)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-3 * want.float().abs().max().item())


@pytest.mark.parametrize("fmt,rounding_a", [("nvfp4", "rne"), ("nvfp4", "sr"), ("mxfp8", "rne")])
def test_gpu_grouped_matmul_matches_reference(monkeypatch, fmt, rounding_a):
    """Experts' fprop / dgrad (2d x 3d) with an empty expert and a group across 128-row scale tiles: the native
    grouped GEMM on sm_100 (the one-launch decoded Triton kernel elsewhere) against the reference's per-group loop."""
    gen = torch.Generator().manual_seed(6)
    offs = torch.tensor([40, 40, 300, 333, 512], dtype=torch.int32)
    a, w = torch.randn(520, 256, generator=gen), torch.randn(5, 256, 192, generator=gen) * 0.02
    w[2] *= 1000.0
    args = dict(rounding_a=rounding_a, seeds=(3, 4), step=1, out_dtype=torch.bfloat16)
    qa, qb = (as_operand(quantize_ref(x, fmt, axis), axis, name) for x, axis, name in ((a, 1, "a"), (w[0], 0, "b")))
    capability = torch.cuda.get_device_capability()
    path, _ = grouped_dispatch.grouped_gemm_path(capability, "2d3d", qa, qb, torch.bfloat16, len(offs))
    assert path == ("native_grouped" if capability >= (10, 0) else "decoded_grouped")
    got = grouped_mm(a.cuda(), w.cuda(), offs.cuda(), fmt, **args).cpu()
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    want = grouped_mm(a, w, offs, fmt, **args)
    assert torch.equal(got[512:], want[512:])
    for s, e in ((0, 40), (40, 300), (300, 333), (333, 512)):
        torch.testing.assert_close(got[s:e].float(), want[s:e].float(), rtol=2**-7,
                                   atol=1e-3 * want[s:e].float().abs().max().item())


@pytest.mark.parametrize("ends", [[64, 64, 320, 352, 512], [40, 40, 300, 333, 512]], ids=["whole-32", "odd"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_gpu_grouped_wgrad_matches_reference(monkeypatch, fmt, ends):
    """Experts' wgrad (2d x 2d, an empty group, SR on both operands), K-grouped quantizations then the native grouped
    GEMM on sm_100, one Triton launch on sm_90, against the reference's per-group loop."""
    gen = torch.Generator().manual_seed(7)
    offs = torch.tensor(ends, dtype=torch.int32)
    x, dy = torch.randn(256, 512, generator=gen), torch.randn(512, 192, generator=gen)
    args = dict(rounding_a="sr", rounding_b="sr", rht=fmt == "nvfp4", seeds=(3, 4), step=1, out_dtype=torch.bfloat16)
    got = grouped_mm(x.cuda(), dy.cuda(), offs.cuda(), fmt, **args).cpu()
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    want = grouped_mm(x, dy, offs, fmt, **args)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    for g in (0, 2, 3, 4):
        torch.testing.assert_close(got[g].float(), want[g].float(), rtol=2**-7,
                                   atol=1e-3 * want[g].float().abs().max().item())


@pytest.mark.parametrize("fmt", ["exact", "bf16"])
def test_gpu_bf16_experts_gemms_run_torch_grouped_mm(fmt):
    """Unquantized experts GEMMs on sm_90 / sm_100: torch's grouped GEMM (its CUTLASS kernel) with the offsets on
    the device, never waiting for the GPU, against the per-group loop on the CPU; the rows past the last offset and
    the empty expert's wgrad exactly zero (torch leaves them undefined)."""
    if torch.cuda.get_device_capability()[0] not in (9, 10):
        pytest.skip("torch's grouped GEMM reads the offsets on the host below sm_90")
    gen = torch.Generator().manual_seed(8)
    offs = torch.tensor([40, 40, 300, 333, 512], dtype=torch.int32)
    x, w = torch.randn(520, 256, generator=gen).bfloat16(), torch.randn(5, 256, 192, generator=gen).bfloat16()
    dy = torch.randn(520, 192, generator=gen).bfloat16()
    cases = ((x, w), (x.t(), dy), (dy, w.transpose(-2, -1)))  # fprop, wgrad, dgrad (a transposed weight view)
    want = [grouped_mm(a, b, offs, fmt, out_dtype=torch.bfloat16) for a, b in cases]
    gpu = [(a.cuda(), b.cuda()) for a, b in cases]
    offs = offs.cuda()
    grouped_mm(*gpu[0], offs, fmt, out_dtype=torch.bfloat16)  # loads the kernel outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = [grouped_mm(a, b, offs, fmt, out_dtype=torch.bfloat16) for a, b in gpu]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    got = [g.cpu() for g in got]
    assert not got[0][512:].any() and not got[1][1].any() and not got[2][512:].any()
    for g, e in zip(got, want):
        torch.testing.assert_close(g.float(), e.float(), rtol=2**-7, atol=1e-2 * e.float().abs().max().item())


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_bf16_experts_gemms_torch_does_not_take_run_in_one_triton_launch(out_dtype):
    """Unquantized experts GEMMs torch's grouped GEMM would loop over on the host (an fp32 output anywhere; bf16
    below sm_90 or on sm_120) run Triton's one-launch bf16 kernels: no wait for the GPU, the loop's values (fp32
    accumulation), zeros where no group writes."""
    capability = torch.cuda.get_device_capability()
    if capability < (8, 0) or out_dtype == torch.bfloat16 and capability[0] in (9, 10):
        pytest.skip("no bf16 tensor cores, or torch's own grouped GEMM runs this product")
    gen = torch.Generator().manual_seed(9)
    offs = torch.tensor([40, 40, 300, 333, 512], dtype=torch.int32)
    x, w = torch.randn(520, 256, generator=gen).bfloat16(), torch.randn(5, 256, 192, generator=gen).bfloat16()
    dy = torch.randn(520, 192, generator=gen).bfloat16()
    cases = ((x, w), (x.t(), dy))  # fprop, wgrad
    want = [grouped_mm(a, b, offs, "exact", out_dtype=out_dtype) for a, b in cases]
    gpu, offs = [(a.cuda(), b.cuda()) for a, b in cases], offs.cuda()
    route = grouped_route(x.cuda().device, "2d3d", "exact", (torch.bfloat16,) * 2, (x.shape, w.shape), len(w), False,
                          out_dtype)
    assert (route.kind, route.host_read) == ("triton_bf16", None)
    for a, b in gpu:  # compiles and tunes outside the check
        grouped_mm(a, b, offs, "exact", out_dtype=out_dtype)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = [grouped_mm(a, b, offs, "exact", out_dtype=out_dtype) for a, b in gpu]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    got = [g.cpu() for g in got]
    assert not got[0][512:].any() and not got[1][1].any()
    tol = 1e-5 if out_dtype == torch.float32 else 2**-7
    for g, e in zip(got, want):
        torch.testing.assert_close(g.float(), e.float(), rtol=tol, atol=tol * e.float().abs().max().item())


def test_gpu_mxfp8_scales_outside_bf16_are_recomputed_in_fp32(monkeypatch):
    """The decoded path flags the values bf16 does not hold on the device and its fp32 kernel recomputes."""
    gen = torch.Generator().manual_seed(4)
    a, b = torch.randn(256, 512, generator=gen) * 2.0**-125, torch.randn(512, 128, generator=gen)
    qa, qb = quantize_ref(a, "mxfp8", 1), quantize_ref(b, "mxfp8", 0)
    ga, gb = to_device(qa, "cuda"), to_device(qb, "cuda")
    capability = torch.cuda.get_device_capability()
    if capability < (10, 0):
        assert dispatch.gemm_path(capability, as_operand(ga, 1, "a"), as_operand(gb, 0, "b"))[0] == "decoded"
    got = dispatch.scaled_mm(ga, gb).cpu()
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    want = dispatch.scaled_mm(qa, qb)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_gpu_quantize_and_matmul_never_wait_for_the_gpu(fmt):
    """Torch's sync debug mode raises on any call that waits for the GPU (a value read on the host, a copy of
    host data): SR and RHT quantizations and the matmul, once their kernels are compiled and tuned."""
    x, w = torch.randn(1024, 512, device="cuda"), torch.randn(512, 768, device="cuda")
    bias = torch.randn(768, device="cuda")

    def run(step: int):
        qa = dispatch.quantize(x, fmt, 1, rounding="sr", seed=sr_stream(3, step), rht=True)
        qb = dispatch.quantize(w, fmt, 0)
        return [dispatch.scaled_mm(qa, qb, b, dtype) for b, dtype in ((None, torch.bfloat16), (bias, torch.float32))]

    run(0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run(1)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_gpu_experts_gemms_never_wait_for_the_gpu(fmt):
    """An experts fprop (2d x 3d) and wgrad (2d x 2d, SR and the RHT), one grouped GEMM each (Triton on sm_90,
    native on sm_100, its scales laid out on the device): the offsets and the step stay on the device."""
    x, w = torch.randn(520, 256, device="cuda"), torch.randn(5, 256, 192, device="cuda")
    dy = torch.randn(520, 192, device="cuda")
    offs, step = torch.tensor([40, 40, 300, 333, 512], dtype=torch.int32, device="cuda"), torch.tensor(1).cuda()

    def run():
        grouped_mm(x, w, offs, fmt, rounding_a="sr", step=step, out_dtype=torch.bfloat16)
        grouped_mm(x.t(), dy, offs, fmt, rounding_a="sr", rounding_b="sr", rht=fmt == "nvfp4", step=step,
                   out_dtype=torch.bfloat16)

    run()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def compiled_gpt(device: str, options: dict, mode: str | None = None):
    """(model, compiled model, tokens, targets): the small GPT these tests train, from seed 0, on ``device``."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyGPT(vocab=512, d=256, layers=2, heads=4, ctx=128, sdpa=True).to(device)
    if mode is not None:  # torch.compile takes mode or options, not both: autoprec's options carry it
        options = {**options, "inner": "inductor", "mode": mode}
    compiled = torch.compile(model, backend="autoprec", options=options)
    idx, tgt = (t.to(device) for t in tokens(batch=8, ctx=128, vocab=512))
    return model, compiled, idx, tgt


@pytest.mark.parametrize("recipe", ["nvfp4_nvidia", "mxfp8", "fp8_block"])
def test_gpu_compiled_training_step_never_waits_for_the_gpu(fresh_dynamo, recipe):
    _, compiled, idx, tgt = compiled_gpt("cuda", {"recipe": recipe})
    for sync_mode in ("default", "error"):  # the first step compiles and tunes
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode(sync_mode)
        try:
            compiled(idx, tgt).backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")


def step(device: str, options: dict) -> tuple[list[torch.Tensor], autoprec.Plan]:
    """Losses of three compiled training steps of a small GPT on ``device`` (the same batch, no optimizer),
    the last step's gradients, and the plan."""
    model, compiled, idx, tgt = compiled_gpt(device, options)
    losses = []
    for _ in range(3):  # the auto recipe calibrates on the first step
        model.zero_grad()
        loss = compiled(idx, tgt)
        loss.backward()
        losses.append(loss.detach())
    return [torch.stack(losses).cpu(), *(p.grad.cpu() for p in model.parameters())], autoprec.plan(compiled)


@pytest.mark.parametrize("recipe", ["nvfp4_nvidia", "mxfp8", "fp8_block", "auto"])
@pytest.mark.parametrize("inner", ["aot_eager", "inductor"])
def test_gpu_training_steps_match_the_cpu(fresh_dynamo, recipe, inner):
    """The same plan on the GPU's kernels and on the CPU's: products differ only in fp32 accumulation order
    (and inductor's fusions), so losses agree closely and gradients point the same way. An auto plan is
    calibrated on the GPU and given to the CPU run (calibrating there could pick differently where two
    candidates score alike), whose steps then all run it: the GPU's first, calibrating step is left out."""
    gpu, plan = step("cuda", {"recipe": recipe, "inner": inner})
    # costed for gb300 (the default); on any other GPU the plan says which table describes this one
    note = device_note("gb300", torch.cuda.get_device_capability(), torch.cuda.get_device_name())
    assert [n for n in plan.notes if n.startswith("running on ")] == ([note] if note else [])
    cpu, cpu_plan = step("cpu", {"recipe": recipe} if recipe != "auto" else {"recipe": "auto", "plan": plan})
    assert not any(n.startswith("running on ") for n in cpu_plan.notes)
    first = 1 if recipe == "auto" else 0
    assert torch.allclose(gpu[0][first:], cpu[0][first:], rtol=2e-3)
    for g, c in zip(gpu[1:], cpu[1:]):
        cos = torch.nn.functional.cosine_similarity(g.flatten(), c.flatten(), dim=0)
        assert cos > 0.99, f"gradient cosine {cos:.4f}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gpu_graph_amax_bits_are_the_stored_tensors(fresh_dynamo, dtype):
    """NVFP4's tensor amax as graph ops (passes/graph_amax.py) compiled by inductor's Triton codegen, which keeps a
    value in fp32 until it stores it: the bits of max|x| over x's finite values as stored, values that round to
    Inf in ``dtype`` left out."""
    fn, h = amax_edge_case(dtype, "cuda")
    x, bits = torch.compile(with_amax_bits(fn, h), backend="inductor")(h)
    assert bits.item() == stored_amax_bits(x)


def test_gpu_reduce_overhead_mode_captures_the_planned_step(fresh_dynamo):
    """torch.compile's mode="reduce-overhead" (CUDA graphs): inductor captures the planned graphs (it skips
    none: the step counter is a device tensor and no op waits for the GPU), and each replay draws its own
    step's SR bits: every step's gradients match those of inductor without graphs (the same kernels; cuBLAS may
    pick other algorithms under capture, and a product that differs in its last bits can flip an element's
    rounding downstream, hence 2%), and differ from step to step by far more (SR noise)."""
    def gradients(mode: str | None) -> list[torch.Tensor]:
        model, compiled, idx, tgt = compiled_gpt("cuda", {"recipe": "nvfp4_nvidia", "inner": "inductor"}, mode)
        out = []
        for _ in range(4):
            model.zero_grad()
            compiled(idx, tgt).backward()
            out.append(model.blocks[0].mlp.fc1.weight.grad.clone())
        return out

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).norm() / b.norm())

    torch._dynamo.utils.counters.clear()
    graphed = gradients("reduce-overhead")
    assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] == 0
    plain = gradients(None)
    assert all(rel(g, e) < 2e-2 for g, e in zip(graphed, plain)), [rel(g, e) for g, e in zip(graphed, plain)]
    assert rel(graphed[3], graphed[2]) > 0.1 and rel(plain[3], plain[2]) > 0.1  # 0.25 on the CPU


class _Experts(torch.nn.Module):
    """Two expert GEMMs over fixed token groups (the offsets an input): the graph's only ops that a CUDA graph
    cannot hold are autoprec's grouped ones."""

    def __init__(self) -> None:
        super().__init__()
        self.w_in = torch.nn.Parameter(torch.randn(4, 64, 128) * 0.125)
        self.w_out = torch.nn.Parameter(torch.randn(4, 128, 64) * 0.09)

    def forward(self, x, offs):
        h = torch.nn.functional.gelu(torch.nn.functional.grouped_mm(x, self.w_in, offs=offs))
        return torch.nn.functional.grouped_mm(h, self.w_out, offs=offs).float().square().mean()


@pytest.mark.parametrize("recipe", ["nvfp4", "bf16"])
def test_gpu_reduce_overhead_captures_expert_graphs(fresh_dynamo, recipe):
    """mode="reduce-overhead" on experts: on sm_90 and sm_100 the quantized grouped products (Triton's, the native
    one) and bf16 ones (torch's grouped GEMM) read nothing on the host, so the rewrite emits the untagged op and
    inductor captures every graph. Training runs, and its gradients equal those without the mode."""
    def grads(mode: str | None) -> list[torch.Tensor]:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = _Experts().cuda().bfloat16()
        options = {"recipe": recipe, "inner": "inductor"} | ({"mode": mode} if mode else {})
        compiled = torch.compile(model, backend="autoprec", options=options)
        x = torch.randn(256, 64, generator=torch.Generator().manual_seed(1)).cuda().bfloat16()
        offs = torch.tensor([64, 64, 200, 256], dtype=torch.int32, device="cuda")
        for _ in range(3):
            model.zero_grad()
            compiled(x, offs).backward()
        return [p.grad.float() for p in model.parameters()]

    torch._dynamo.utils.counters.clear()
    graphed = grads("reduce-overhead")
    skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    assert skips == 0
    for g, e in zip(graphed, grads(None)):
        assert torch.equal(g, e)
