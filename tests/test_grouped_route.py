"""One decision for a grouped product (kernels/dispatch/grouped_route.py): the route ``grouped_mm`` runs is
the route whose
``host_read`` the rewrite and the capture check read. Here each route runs on a GPU stood in for (its capability
answered, Triton's kernels in the interpreter, torch's CPU ops in place of its CUDA kernels) under ``HostReads``:
a device value is read on the host exactly where the route says so, and the route names the path that ran."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from autoprec.kernels.dispatch import grouped as grouped_dispatch
from autoprec.kernels.dispatch.grouped_mm import group_count, grouped_layout, grouped_mm
from autoprec.kernels.dispatch.grouped_route import grouped_route

from helpers import record_calls, stand_in_gpu
from test_no_host_sync import HostReads
from test_sm100_grouped_native import fake_scaled_grouped_mm

BF16, FP32 = torch.bfloat16, torch.float32
ENDS = [16, 16, 40, 64]  # an empty group; 64 tokens, 16 rows past the last offset
T, K, N = 80, 64, 32

# (capability, fmt, layout, k, tile2d_b, out_dtype, kind, path, what the host read names; None: nothing read)
CASES = [
    ((9, 0), "nvfp4", "2d3d", K, False, BF16, "experts", "decoded_grouped", None),
    ((9, 0), "mxfp8", "2d2d", K, False, FP32, "wgrad", "decoded_grouped", None),
    ((9, 0), "nvfp4", "2d3d", 40, False, BF16, "experts", "decoded_grouped", None),  # zero-padded to 48
    ((9, 0), "nvfp4", "2d2d", K, True, BF16, "per_group", None, "16x16 tiles"),
    ((9, 0), "nvfp4", "3d3d", K, False, BF16, "experts", "decoded_grouped", None),  # items as equal token groups
    ((9, 0), "mxfp8", "3d3d", 40, False, BF16, "experts", "decoded_grouped", None),  # zero-padded to 64
    ((9, 0), "nvfp4", "2d3d", K, False, torch.float16, "experts", "decoded_grouped", None),  # fp32, rounded once
    ((9, 0), "bf16", "2d3d", K, False, BF16, "torch", None, None),
    ((9, 0), "bf16", "2d2d", K, False, FP32, "triton_bf16", None, None),  # an output torch's kernel does not write
    ((9, 0), "bf16", "2d3d", K, False, torch.float16, "triton_bf16", None, None),
    ((9, 0), "bf16", "3d3d", K, False, FP32, "triton_bf16", None, None),  # a batch: equal groups
    ((7, 5), "bf16", "3d3d", K, False, BF16, "loop", None, None),  # a batch: no bounds to read
    ((8, 0), "bf16", "2d3d", K, False, BF16, "triton_bf16", None, None),  # torch's kernel: sm_90 and sm_100 only
    ((7, 5), "bf16", "2d2d", K, False, BF16, "loop", None, "no bf16 tensor-core MMA"),
    ((10, 0), "nvfp4", "2d3d", K, False, BF16, "experts", "native_grouped", None),
    ((10, 0), "mxfp8", "2d2d", K, False, BF16, "wgrad", "native_grouped", None),
    ((10, 0), "mxfp8_e5m2", "2d3d", K, False, BF16, "experts", "decoded_grouped", None),
    ((12, 0), "nvfp4", "2d3d", K, False, BF16, "experts", "decoded_grouped", None),  # torch's grouped GEMM refuses
]
# slow: the interpreter runs an MXFP8 wgrad's K-grouped slice quantizers for 14 s; the default run's has fp32 out
SLOW_CASES = [((9, 0), "mxfp8", "2d2d", K, False, torch.float16, "wgrad", "decoded_grouped", None)]


def case_id(c: tuple) -> str:
    return f"sm{c[0][0]}{c[0][1]}-{c[1]}-{c[2]}-k{c[3]}{'-16x16' if c[4] else ''}-{str(c[5])[6:]}"


def operands(layout: str, k: int):
    gen = torch.Generator().manual_seed(0)
    if layout == "2d3d":
        return torch.randn(T, k, generator=gen).to(BF16), torch.randn(len(ENDS), k, N, generator=gen).to(BF16)
    if layout == "2d2d":  # a wgrad: (M, T) activations, a transposed view as autograd gives them
        return torch.randn(T, k, generator=gen).to(BF16).t(), torch.randn(T, N, generator=gen).to(BF16)
    return torch.randn(len(ENDS), 8, k, generator=gen).to(BF16), torch.randn(len(ENDS), k, N, generator=gen).to(BF16)


def run_as_gpu(monkeypatch, capability, fmt, layout, k, tile2d_b, out_dtype):
    """(route, host reads, paths run) of one grouped_mm call on the stood-in GPU, after a first call outside the
    record."""
    stand_in_gpu(monkeypatch, capability)
    monkeypatch.setattr(F, "scaled_grouped_mm", fake_scaled_grouped_mm, raising=False)  # torch's contract
    calls = []
    for name in ("experts_mm", "wgrad_mm"):
        record_calls(monkeypatch, grouped_dispatch, name, calls)
    a, b = operands(layout, k)
    offs = None if layout == "3d3d" else torch.tensor(ENDS, dtype=torch.int32)
    args = dict(rounding_a="sr", tile2d_b=tile2d_b, step=torch.tensor(3), out_dtype=out_dtype)
    layout = grouped_layout(a.ndim, b.ndim, offs is not None)
    groups = group_count(a.shape, None if offs is None else offs.shape, layout)
    route = grouped_route(a.device, layout, fmt, (a.dtype, b.dtype), (a.shape, b.shape), groups, tile2d_b, out_dtype)
    grouped_mm(a, b, offs, fmt, **args)
    calls.clear()
    with HostReads() as rec:
        grouped_mm(a, b, offs, fmt, **args)
    return route, rec.found, [(name, given[4]) for name, given in calls]  # both take the path 5th


@pytest.mark.parametrize("capability,fmt,layout,k,tile2d_b,out_dtype,kind,path,read",
                         [pytest.param(*c, id=case_id(c)) for c in CASES]
                         + [pytest.param(*c, id=case_id(c), marks=pytest.mark.slow) for c in SLOW_CASES])
def test_sm90_sm100_grouped_mm_reads_the_host_exactly_where_its_route_says(monkeypatch, capability, fmt, layout, k,
                                                                          tile2d_b, out_dtype, kind, path, read):
    route, found, ran = run_as_gpu(monkeypatch, capability, fmt, layout, k, tile2d_b, out_dtype)
    assert (route.kind, route.path) == (kind, path)
    assert (found != []) == (route.host_read is not None), (route, found)
    assert route.host_read is None if read is None else read in route.host_read
    if kind in ("experts", "wgrad"):  # the product ran the path its route named
        assert ran == [("experts_mm" if kind == "experts" else "wgrad_mm", path)]


@pytest.mark.parametrize("fmt,read", [("mxfp8", True), ("nvfp4", False)])
def test_sm90_forced_triton_kernel_reads_mxfp8_scales_on_the_host(monkeypatch, fmt, read):
    """``AUTOPREC_KERNELS=triton`` on a GPU: the in-register grouped kernel checks MXFP8 scales against bf16's range
    on the host (NVFP4's always decode exactly), and the route says so."""
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    route, found, _ = run_as_gpu(monkeypatch, (9, 0), fmt, "2d3d", K, False, BF16)
    assert route.path == "triton_grouped"
    assert (found != []) == read == (route.host_read is not None)


def test_routes_off_a_gpu_say_so():
    """On the CPU every route is host work ("not a CUDA device"); auto mode there quantizes group by group."""
    route = grouped_route(torch.device("cpu"), "2d3d", "nvfp4", (BF16, BF16), ((T, K), (4, K, N)), 4, False, BF16)
    assert (route.kind, route.path, route.host_read) == ("experts", "per_group", "not a CUDA device")


def test_symbolic_sizes_route_as_compiled_graphs_need(monkeypatch):
    """A symbolic token count (dynamic shapes) chooses nothing: the route is the one-launch path, capturable. A size a
    path depends on that is symbolic takes the route that assumes nothing: per group, which reads the host (so the
    graph keeps the tag that keeps CUDA graphs off it)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    stand_in_gpu(monkeypatch, (9, 0))
    env = ShapeEnv()
    tokens, hidden = env.create_unbacked_symint(), env.create_unbacked_symint()
    for layout, shapes in (("2d3d", ((tokens, K), (4, K, N))), ("2d2d", ((K, tokens), (tokens, N)))):
        route = grouped_route(torch.device("cpu"), layout, "nvfp4", (BF16, BF16), shapes, 4, False, BF16)
        assert (route.path, route.host_read) == ("decoded_grouped", None)
    route = grouped_route(torch.device("cpu"), "2d2d", "nvfp4", (BF16, BF16), ((hidden, T), (T, N)), 4, False, BF16)
    assert route.kind == "per_group" and "symbolic" in route.host_read
