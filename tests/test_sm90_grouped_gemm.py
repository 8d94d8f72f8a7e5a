"""The experts' one-launch grouped GEMM (2d x 3d, offsets read on the device; kernels/triton/grouped_mm.py) in the
interpreter: each group's rows equal the dense reference GEMM of that group's own quantizations (fp32 accumulation
order), rows past the last offset are zero, values bf16 does not hold go to the fp32 kernel, and the decoded
(sm_90) path reads nothing on the host. Which path runs where: test_sm100_grouped_native.py."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from autoprec.formats import get_format
from autoprec.kernels.core.quantized import QuantizedGroups
from autoprec.kernels.dispatch import dense as dispatch
from autoprec.kernels.dispatch.grouped import experts_mm, experts_operands
from autoprec.kernels.dispatch.grouped_route import grouped_route
from autoprec.kernels.triton.grouped_mm import grouped_mm_decoded
from autoprec.kernels.triton.quantize_grouped import quantize_batches_triton, quantize_row_groups_triton

from helpers import grouped_paths_on_stand_in_gpu, pairwise, stand_in_gpu, to_device
from test_no_host_sync import HostReads

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# an empty first group, a group across the 64- and 128-row tiles, a one-row group, rows past the last offset
ENDS = [0, 40, 40, 150, 151, 290]
T, K, N = 300, 64, 48


def inputs(token_scale: float = 1.0):
    """(tokens, six expert weights of very different magnitudes, offsets, step) on the device."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(T, K, generator=gen) * token_scale
    w = torch.randn(len(ENDS), K, N, generator=gen)
    w[3] *= 1000.0
    return x.to(DEVICE), w.to(DEVICE), torch.tensor(ENDS, dtype=torch.int32).to(DEVICE), torch.tensor(2).to(DEVICE)


def quantized(fmt: str, x, w, offs, step, tile2d: bool = False):
    """The token groups (SR) and the expert weights, quantized by the grouped quantizers."""
    f = get_format(fmt)
    qa = QuantizedGroups(f, *quantize_row_groups_triton(x, f, offs, seed=5, step=step), x.shape)
    qb = QuantizedGroups(f, *quantize_batches_triton(w, f, seed=None, step=step, tile2d=tile2d), w.shape,
                         16 if tile2d else 1)
    return qa, qb


def operands(fmt: str, tile2d: bool = False, token_scale: float = 1.0):
    x, w, offs, step = inputs(token_scale)
    return *quantized(fmt, x, w, offs, step, tile2d), offs


def per_group_reference(qa, qb, monkeypatch) -> list[torch.Tensor]:
    """Each non-empty group's fp32 product by the reference (its own quantizations, dequantized)."""
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    out = []
    for g, (s, e) in enumerate(zip([0] + ENDS[:-1], ENDS)):
        if e > s:
            a, b = to_device(qa.group(g, slice(s, e)), "cpu"), to_device(qb.group(g), "cpu")
            out.append(dispatch.scaled_mm(a, b, None, torch.float32))
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    return out


def assert_groups_close(got: torch.Tensor, want: list[torch.Tensor], out_dtype: torch.dtype):
    tol = 2**-8 if out_dtype == torch.bfloat16 else 1e-5
    groups = [(s, e) for s, e in zip([0] + ENDS[:-1], ENDS) if e > s]
    for (s, e), w in zip(groups, want):
        torch.testing.assert_close(got[s:e].float(), w, rtol=tol, atol=tol * w.abs().max().item())
    assert torch.equal(got[ENDS[-1]:], torch.zeros_like(got[ENDS[-1]:]))


CASES = {"nvfp4": ("nvfp4", False), "nvfp4-16x16": ("nvfp4", True), "mxfp8": ("mxfp8", False),
         "mxfp8_e5m2": ("mxfp8_e5m2", False)}


@pytest.mark.parametrize(("case", "path", "out_dtype"), pairwise(
    CASES, {"sm90_decoded": "decoded_grouped", "sm90_in_register": "triton_grouped"},
    {"fp32": torch.float32, "bf16": torch.bfloat16}))
def test_sm90_grouped_gemm_equals_each_groups_dense_gemm(monkeypatch, case, path, out_dtype):
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    qa, qb, offs = operands(*case)
    got = experts_mm(qa, qb, offs, out_dtype, path).cpu()
    assert got.dtype == out_dtype and got.shape == (T, N)
    assert_groups_close(got, per_group_reference(qa, qb, monkeypatch), out_dtype)


@pytest.mark.parametrize("path", ["decoded_grouped", "triton_grouped"], ids=["sm90_decoded", "sm90_in_register"])
def test_sm90_grouped_gemm_recomputes_values_bf16_does_not_hold(monkeypatch, path):
    """MXFP8 tokens near 2**-128 decode to values below bf16's normal range: the decoded path flags them on the
    device and its fp32 kernel recomputes, the in-register path takes the fp32 dot; both equal the reference."""
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    qa, qb, offs = operands("mxfp8", token_scale=2.0**-128)
    got = experts_mm(qa, qb, offs, torch.float32, path).cpu()
    want = per_group_reference(qa, qb, monkeypatch)
    assert all(w.abs().max() > 0 for w in want)
    assert_groups_close(got, want, torch.float32)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_sm90_grouped_experts_gemm_reads_nothing_on_the_host(fmt):
    """Token groups and expert weights quantized, then multiplied by the decoded one-launch GEMM: the offsets, the
    step and the group sizes never leave the device (the per-group loop read them all)."""
    x, w, offs, step = inputs()
    a, b = experts_operands(*quantized(fmt, x, w, offs, step))
    grouped_mm_decoded(a, b, len(ENDS), offs, torch.bfloat16)  # compiled outside the check
    with HostReads() as rec:
        a, b = experts_operands(*quantized(fmt, x, w, offs, step))
        grouped_mm_decoded(a, b, len(ENDS), offs, torch.bfloat16)
    assert rec.found == []


def test_sm90_grouped_gemm_path_runs_in_one_launch_in_the_interpreter(monkeypatch):
    """A quantized 2d x 3d grouped_mm under AUTOPREC_KERNELS=triton takes the one-launch kernel (no dense GEMM per
    group) and matches auto mode's per-group CPU kernels."""
    from autoprec.kernels.dispatch.grouped_mm import grouped_mm

    gen = torch.Generator().manual_seed(4)
    a, w = torch.randn(T, K, generator=gen), torch.randn(len(ENDS), K, N, generator=gen)
    offs = torch.tensor(ENDS, dtype=torch.int32)
    opts = dict(rounding_a="sr", seeds=(3, 4), step=torch.tensor(1), out_dtype=torch.float32)
    expected = grouped_mm(a, w, offs, "nvfp4", **opts)
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    monkeypatch.setattr(dispatch, "scaled_mm", lambda *args: pytest.fail("a dense GEMM per group"))
    torch.testing.assert_close(grouped_mm(a, w, offs, "nvfp4", **opts), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fmt,k", [("nvfp4", K), ("mxfp8", 40), pytest.param("mxfp8", K, marks=pytest.mark.slow),
                                   pytest.param("nvfp4", 40, marks=pytest.mark.slow)])  # each value once by default
def test_sm90_batched_grouped_mm_is_one_launch_reading_nothing_on_the_host(monkeypatch, fmt, k):
    """A quantized 3d x 3d grouped_mm (a batch of experts) on a stood-in H100: its items' rows are equal token
    groups of the one-launch experts GEMM, whose ends are made on the device (no host read, no dense GEMM per
    item), equal to auto mode's per-item CPU kernels up to accumulation order; a reduction that is not whole blocks
    (40) zero-padded once for the batch."""
    from autoprec.kernels.dispatch.grouped_mm import grouped_mm

    gen = torch.Generator().manual_seed(5)
    a, w = torch.randn(6, 40, k, generator=gen), torch.randn(6, k, N, generator=gen)
    opts = dict(rounding_a="sr", seeds=(3, 4), step=torch.tensor(1), out_dtype=torch.float32)
    expected = grouped_mm(a, w, None, fmt, **opts)
    stand_in_gpu(monkeypatch, (9, 0))
    route = grouped_route(a.device, "3d3d", fmt, (a.dtype, w.dtype), (a.shape, w.shape), 6, False, torch.float32)
    assert (route.kind, route.path, route.host_read) == ("experts", "decoded_grouped", None)
    monkeypatch.setattr(dispatch, "scaled_mm", lambda *args: pytest.fail("a dense GEMM per item"))
    grouped_mm(a, w, None, fmt, **opts)  # compiled outside the check
    with HostReads() as rec:
        got = grouped_mm(a, w, None, fmt, **opts)
    assert rec.found == []
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("recipe,capability,capturable", [
    ("nvfp4", (9, 0), True), ("nvfp4", (10, 0), True), ("bf16", (9, 0), True), ("bf16", (10, 0), True),
    ("bf16", (8, 0), True), ("bf16", (7, 5), False)],
    ids=["nvfp4-sm90", "nvfp4-sm100", "bf16-sm90", "bf16-sm100", "bf16-sm80", "bf16-sm75"])
def test_sm90_rewrite_emits_the_grouped_op_cuda_graphs_can_capture(monkeypatch, fresh_dynamo, recipe, capability,
                                                                   capturable):
    """Compiled as for a GPU of a given capability (stood in for), an MoE block's experts GEMMs (fprop, dgrad, wgrad)
    become ``grouped_mm_on_device``, without the tag that keeps inductor's reduce-overhead mode from capturing a
    graph, where they read nothing on the host: quantized (one Triton launch on sm_90, the native grouped GEMM on
    sm_100) and in bf16 (torch's grouped GEMM on sm_90 and sm_100, Triton's bf16 kernels on sm_80); the tagged op
    for bf16 on sm_75, which has no bf16 tensor cores (the groups loop on the host)."""
    from test_moe import MoEBlock

    from autoprec import pipeline
    from autoprec.passes import rewrite

    graphs = []
    orig = pipeline.pair_quantizations
    monkeypatch.setattr(pipeline, "pair_quantizations", lambda gm: graphs.append(gm) or orig(gm))
    def route_on_gpu(*args):  # the rewrite routes as on the stand-in GPU; the step itself runs on this CPU
        with monkeypatch.context() as gpu:
            stand_in_gpu(gpu, capability)
            return grouped_route(*args)

    monkeypatch.setattr(rewrite, "grouped_route", route_on_gpu)
    torch.manual_seed(0)
    model = MoEBlock().bfloat16()
    compiled = torch.compile(model, backend="autoprec", options={"recipe": recipe})
    compiled(torch.randint(0, 16, (95,), generator=torch.Generator().manual_seed(0))).float().pow(2).mean().backward()
    grouped = [n.target for g in graphs for n in g.graph.nodes if "grouped_mm" in str(n.target)]
    assert len(grouped) == 6  # two experts GEMMs: fprop, dgrad, wgrad
    on_device = torch.ops.autoprec.grouped_mm_on_device.default
    assert all((t is on_device) == capturable for t in grouped)
    assert all((torch.Tag.cudagraph_unsafe in t.tags) != capturable for t in grouped)


@pytest.mark.parametrize("fmt", ["nvfp4", pytest.param("mxfp8", marks=pytest.mark.slow)])
def test_sm90_grouped_gemm_with_many_small_groups(monkeypatch, fmt):
    """70 experts of 0-4 tokens (a sampler's decode step: most row tiles hold a group of their own; the kernel's
    group table is 128 wide), bf16 tokens: the one-launch 2d x 3d product equals auto mode's per-group CPU
    kernels."""
    from autoprec.kernels.dispatch.grouped_mm import grouped_mm

    gen = torch.Generator().manual_seed(5)
    offs = torch.randint(0, 5, (70,), generator=gen).cumsum(0).to(torch.int32)
    a = torch.randn(int(offs[-1]) + 2, 64, generator=gen).bfloat16()
    w = torch.randn(70, 64, 24, generator=gen).bfloat16()
    opts = dict(rounding_a="sr", seeds=(1, 2), step=3, out_dtype=torch.float32)
    want = grouped_mm(a, w, offs, fmt, **opts)
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    torch.testing.assert_close(grouped_mm(a, w, offs, fmt, **opts), want, rtol=1e-5,
                               atol=1e-5 * want.abs().max().item())


def test_sm90_compiled_batch_of_experts_runs_each_product_as_one_grouped_gemm(monkeypatch, fresh_dynamo):
    """End to end: capacity-style experts (``F.grouped_mm`` of (E, C, D) tokens by (E, D, H) weights, no offsets)
    compiled under the nvfp4 recipe for a stood-in H100: every quantized 3d x 3d product of a step (fprop, dgrad and
    wgrad of both projections) is one grouped GEMM on the decoded path, with the gradients of the CPU's per-item
    kernels; the rewrite emits them as the op CUDA graphs may capture (the CPU's compile, as the tagged op)."""
    from autoprec import pipeline

    graphs = []
    orig = pipeline.pair_quantizations
    monkeypatch.setattr(pipeline, "pair_quantizations", lambda gm: graphs.append(gm) or orig(gm))

    class BatchOfExperts(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w_in = torch.nn.Parameter(torch.randn(4, 32, 64) / 32**0.5)
            self.w_out = torch.nn.Parameter(torch.randn(4, 64, 32) / 8.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.grouped_mm(F.gelu(F.grouped_mm(x, self.w_in)), self.w_out)

    x = torch.randn(4, 32, 32, generator=torch.Generator().manual_seed(1)).bfloat16()

    def grads(seed_model: BatchOfExperts) -> list[torch.Tensor]:
        model = BatchOfExperts().bfloat16()
        model.load_state_dict(seed_model.state_dict())
        tokens = x.clone().requires_grad_()
        compiled = torch.compile(model, backend="autoprec", options={"recipe": "nvfp4"})
        compiled(tokens).float().square().mean().backward()
        return [tokens.grad] + [p.grad for p in model.parameters()]

    torch.manual_seed(0)
    seed_model = BatchOfExperts().bfloat16()
    assert grouped_paths_on_stand_in_gpu(monkeypatch, (9, 0), lambda: grads(seed_model)) == ["decoded_grouped"] * 6
    ops = sorted(str(n.target) for g in graphs for n in g.graph.nodes if "grouped_mm" in str(n.target))
    assert ops == ["autoprec.grouped_mm.default"] * 6 + ["autoprec.grouped_mm_on_device.default"] * 6
