"""Shared test helpers."""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from autoprec.kernels.cuda.swizzle import swizzle_scales


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of ``approx`` against ``ref`` in dB."""
    ref, approx = ref.double(), approx.double()
    return float(10 * torch.log10(ref.pow(2).sum() / (approx - ref).pow(2).sum()))


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when two tensors hold the same bytes (NaN payloads and signed zeros included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def mismatch(got, want) -> str | None:
    """None when QuantizedTensor ``got`` (on any device) is ``want``: the same bytes and dtypes of codes, scales and
    NVFP4's tensor scale, and the same axis, shape and tile rows; else what differs, with how many code and scale
    bytes do."""
    got = to_device(got, "cpu")
    pairs = [(got.codes, want.codes), (got.scales, want.scales), (got.tensor_scale, want.tensor_scale)]
    meta = [(name, getattr(got, name), getattr(want, name)) for name in ("axis", "shape", "tile_rows")]
    same_bytes = all(w is None or (g is not None and bits_equal(g, w)) for g, w in pairs)
    if same_bytes and all(g == w for _, g, w in meta):
        return None
    parts = [f"{name} {g} / {w}" for name, g, w in meta]
    for f in ("codes", "scales"):
        a, b = getattr(got, f), getattr(want, f)
        count = int((a.view(torch.uint8) != b.view(torch.uint8)).sum()) if a.shape == b.shape else "all"
        parts.append(f"{f} ({a.dtype} / {b.dtype}): {count} of {b.numel()} bytes differ")
    if want.tensor_scale is not None:
        parts.append(f"tensor scale {got.tensor_scale} / {want.tensor_scale}")
    return ", ".join(parts)


def assert_same(got, want) -> None:
    """``got`` is ``want`` (``mismatch``), else a failure saying what differs."""
    problem = mismatch(got, want)
    assert problem is None, problem


def edge_tensor(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Random normal data with edge blocks: zero, Inf, -Inf, NaN (and one with its sign bit set), tiny (subnormal
    scales), saturating."""
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    x[0, :32] = 0.0
    x[1, 3] = float("inf")
    x[2, 40] = float("-inf")
    x[3, 7] = float("nan")
    x[4, :32] = 1e-30
    x[5, :32] *= 2.0**-20
    x[6, 0] = 3e38
    x[7, 33] = -0.0
    x[8, 35] = -float("nan")
    return x


def to_device(q, device):
    """A QuantizedTensor with its codes, scales and tensor scale moved to ``device``."""
    ts = None if q.tensor_scale is None else q.tensor_scale.to(device)
    return replace(q, codes=q.codes.to(device), scales=q.scales.to(device), tensor_scale=ts)


_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def unswizzle(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The (rows, cols) scale matrix a SWIZZLE_32_4_4 buffer holds (padding dropped)."""
    where = swizzle_scales(torch.arange(1, rows * cols + 1).reshape(rows, cols))
    out = torch.zeros(rows * cols, dtype=flat.dtype)
    out[where[where > 0] - 1] = flat[where > 0]
    return out.reshape(rows, cols)


def decode_swizzled(mat: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    """float64 values of a (rows, K) operand from its codes (FP8, or packed ``float4_e2m1fn_x2``) and its
    SWIZZLE_32_4_4 block scales (E4M3 for NVFP4, E8M0 for MXFP8), as Blackwell's block-scaled GEMMs read them."""
    if mat.dtype == torch.float4_e2m1fn_x2:
        byte = mat.view(torch.uint8)
        nib = torch.stack([byte & 0xF, byte >> 4], -1).flatten(-2).long()
        vals = _E2M1[nib & 7] * torch.where(nib >= 8, -1.0, 1.0)
    else:
        vals = mat.float()
    rows, k = vals.shape
    blocks = -(-k // block)
    assert scale.numel() == -(-rows // 128) * 128 * -(-blocks // 4) * 4 and scale.is_contiguous()
    s = unswizzle(scale.view(torch.uint8), rows, blocks)
    s = s.view(scale.dtype).float() if scale.dtype == torch.float8_e4m3fn else torch.exp2(s.double() - 127)
    return vals.double() * s.double().repeat_interleave(block, 1)[:, :k]


def stand_in_gpu(monkeypatch, capability: tuple[int, int]) -> None:
    """Dispatch as on a GPU of this compute capability, stood in for on this CPU: ``device_capability`` answers it,
    and Triton's kernels run (in the interpreter) wherever they take the input."""
    from autoprec.kernels.dispatch import dense as dispatch

    monkeypatch.setattr(dispatch, "device_capability", lambda device: capability)
    monkeypatch.setattr(dispatch, "triton_problem", lambda device, reason: reason)


def tile_id(config) -> str:
    """A quantizer tile config's test id: rows x columns, warps."""
    return f"{config.kwargs['BR']}x{config.kwargs['BK']}w{config.num_warps}"


def force_tile(monkeypatch, kernels, config) -> None:
    """Make each autotuned Triton kernel of ``kernels`` run ``config`` alone (one config: the autotuner runs it
    without timing), as a GPU may pick it."""
    for kernel in kernels:
        monkeypatch.setattr(kernel, "configs", [config])
        monkeypatch.setattr(kernel, "cache", {})


def pairwise(*axes: dict[str, object]) -> list:
    """Every combination of the axes' values (each axis an ordered {id: value}) as pytest params with ids joined by
    "-", the combinations outside a pairwise cover marked slow: the default run still runs each pair of values of
    any two axes together (a greedy cover, deterministic), ``-m slow`` the rest of the product."""
    cases = list(itertools.product(*(list(a.items()) for a in axes)))
    width = min(2, len(axes))  # with one axis, each value alone

    def pairs(case) -> set:
        return {tuple((i, case[i][0]) for i in ij) for ij in itertools.combinations(range(len(case)), width)}

    uncovered, cover = set().union(*map(pairs, cases)), set()
    while uncovered:
        best = max(range(len(cases)), key=lambda n: len(pairs(cases[n]) & uncovered))
        cover.add(best)
        uncovered -= pairs(cases[best])
    return [pytest.param(*(v for _, v in case), id="-".join(k for k, _ in case),
                         marks=[] if n in cover else [pytest.mark.slow]) for n, case in enumerate(cases)]


def tile_sweep(cases: list) -> list:
    """pytest params of a tile sweep over ``cases`` (tile configs, or (format, config) pairs): on a CUDA GPU every
    tile; in the interpreter each format's first tile in the default run, the others slow (forcing a GPU tile there
    costs seconds per tile, and the default run's other tests run the interpreter's own tile)."""
    interpreted, params, seen = not torch.cuda.is_available(), [], set()
    for case in cases:
        fmt, config = case if isinstance(case, tuple) else (None, case)
        name = f"{fmt}-{tile_id(config)}" if fmt else tile_id(config)
        marks = [pytest.mark.slow] if interpreted and fmt in seen else []
        params.append(pytest.param(*(case if fmt else (case,)), id=name, marks=marks))
        seen.add(fmt)
    return params


def case_ids(cases) -> list[str]:
    """Test ids of (format, tile config) cases."""
    return [f"{fmt}-{tile_id(config)}" for fmt, config in cases]


def slice_tile_cases() -> list[tuple[str, object]]:
    """(format, config) of every tile the slice kernels (blocks down a strided dim) tune over."""
    from autoprec.kernels.triton import quantize_cols as qc

    return [("nvfp4", c) for c in qc.NVFP4_CONFIGS] + [("mxfp8", c) for c in qc.MXFP8_CONFIGS]


def one_read_tile_cases() -> list[tuple[str, object]]:
    """(format, config) of every tile the one-read quantizers tune over."""
    from autoprec.kernels.triton import quantize_dual as qd

    return [("nvfp4", c) for c in qd.NVFP4_CONFIGS] + [("mxfp8", c) for c in qd.MXFP8_CONFIGS]


def force_one_read_tile(monkeypatch, fmt: str, config) -> None:
    """``force_tile`` for the one-read kernels ``fmt`` runs (NVFP4: its amax pass too)."""
    from autoprec.kernels.triton import quantize_dual as qd

    nvfp4 = (qd._amax2_kernel, qd._nvfp4_dual_kernel)
    force_tile(monkeypatch, nvfp4 if fmt == "nvfp4" else (qd._mxfp8_dual_kernel,), config)


def record_calls(monkeypatch, module, name: str, calls: list) -> None:
    """Replace ``module.name`` by a wrapper that appends ``(name, args)`` to ``calls``, then runs it."""
    real = getattr(module, name)

    def run(*args, **kwargs):
        calls.append((name, args))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, run)


def record_runs(monkeypatch, labelled, ran: list) -> None:
    """Make each Triton kernel of ``labelled`` ((label, kernel) pairs) append its label to ``ran`` when it runs."""
    for label, kernel in labelled:
        monkeypatch.setattr(kernel, "run", lambda *a, _run=kernel.run, _label=label, **kw: ran.append(_label) or
                            _run(*a, **kw))


def grouped_paths_on_stand_in_gpu(monkeypatch, capability: tuple[int, int], grads) -> list[str]:
    """Run ``grads()`` (a compiled step returning its gradients) on this CPU's reference kernels, then again on a
    stood-in GPU of this capability (dynamo reset between), assert the two steps' gradients close, and return the
    paths of the grouped GEMMs (``experts_mm``) the stood-in step ran."""
    from autoprec.kernels.dispatch import grouped as grouped_dispatch

    want = grads()
    torch._dynamo.reset()
    stand_in_gpu(monkeypatch, capability)
    calls: list = []
    record_calls(monkeypatch, grouped_dispatch, "experts_mm", calls)
    got = grads()
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=2**-6, atol=1e-2 * w.float().abs().max().item())
    return [args[-1] for _, args in calls]


class RecordedKernel:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` launches it and records ``grid`` in ``launches``."""

    def __init__(self, kernel, launches: list):
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        self.launches.append(grid)
        return self.kernel[grid]


def stored_amax_bits(y: torch.Tensor) -> int:
    """The fp32 bits of max|y| over y's finite values as stored (0 where none is)."""
    y = y.float()
    return torch.where(y.isfinite(), y.abs(), 0.0).max().view(torch.int32).item()


def amax_edge_case(dtype: torch.dtype, device: str = "cpu") -> tuple:
    """(fn, h): fn(h) = GELU(h) x 2.99, computed in fp32 and stored in ``dtype``, has a value finite in fp32 that
    rounds to Inf in dtype (bf16, fp16), values just below, an fp32 Inf, NaN, -Inf, a subnormal, negatives."""
    scale = 2.99

    def fn(h: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(h) * scale

    big = torch.finfo(dtype).max
    h = torch.randn(64, 96, generator=torch.Generator().manual_seed(2)) * 1.5
    h[0, :6] = torch.tensor([big / scale * 0.99999, big / 2.9, float("nan"), -float("inf"), 1e-40, -5.0])
    h = h.to(dtype)
    if dtype != torch.float32:  # the dtype's values next to big / scale, whose product rounds to Inf in dtype
        bits = torch.tensor([big / scale]).to(dtype).view(torch.int16) + torch.arange(-8, 9, dtype=torch.int16)
        near = bits.view(dtype)
        y = fn(near.float())
        edge, below = near[torch.isfinite(y) & torch.isinf(y.to(dtype))], near[torch.isfinite(y.to(dtype))]
        assert len(edge) and len(below), dtype
        h[1, :2] = torch.stack([edge[0], below.max()])
    return fn, h.to(device)


def with_amax_bits(fn, h: torch.Tensor) -> torch.fx.GraphModule:
    """``fn`` traced on ``h`` returning (x, ``passes.graph_amax.amax_bits`` of x)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from autoprec.passes.graph_amax import amax_bits

    gm = make_fx(fn, tracing_mode="fake")(h)
    out = next(iter(gm.graph.find_nodes(op="output")))
    x = out.args[0]
    with gm.graph.inserting_before(out):
        out.args = ((x, amax_bits(gm.graph, x, x)),)
    gm.recompile()
    return gm
