"""The grouped quantizers (every expert's tokens in one launch, offsets read on the device; every expert's weight in
one launch) make, group by group, the bytes of quantizing each group alone (interpreter on CPU), and a grouped
GEMM, alone and in a compiled MoE block, runs through them."""
import pytest
import torch

from helpers import bits_equal, edge_tensor, force_tile, record_runs, slice_tile_cases, tile_sweep

triton = pytest.importorskip("triton")

from autoprec.formats import get_format
from autoprec.kernels import quantize_ref, rht_ref
from autoprec.kernels.core.random_bits import group_seed, sr_bits, sr_stream
from autoprec.kernels.dispatch import dense as dispatch
from autoprec.kernels.dispatch import grouped as grouped_dispatch
from autoprec.kernels.dispatch.grouped_mm import grouped_mm
from autoprec.kernels.triton import quantize_grouped as quantize_grouped_triton
from autoprec.kernels.triton.quantize_grouped import quantize_batches_triton, quantize_row_groups_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
STEP = 5
# groups: an empty one, one inside a tile, several across the 16-row tiles, and rows past the last offset
ENDS = [0, 5, 5, 37, 38, 70]


def tokens(rows: int = 76, k: int = 96) -> torch.Tensor:
    """Edge values (NaN, Inf, subnormals) with the groups 1000x apart, so each needs its own tensor scale."""
    x = edge_tensor(rows, k)
    return x * torch.tensor([1000.0 ** (i % 3 - 1) for i in range(rows)])[:, None]


def reference_groups(x, fmt, seed, rht=False, ends=ENDS):
    """Each group (cumulative ``ends``) quantized alone by the reference, with its own SR stream (None: round to
    nearest); None for an empty group."""
    out, start = [], 0
    for g, end in enumerate(ends):
        part = x[start:end]
        if end > start:
            src = rht_ref(part, 1) if rht else part
            rand = None if seed is None else sr_bits(part.shape, sr_stream(group_seed(seed, g), STEP))
            out.append(quantize_ref(src, fmt, 1, rounding="rne" if seed is None else "sr", rand=rand))
        else:
            out.append(None)
        start = end
    return out


def record_calls(monkeypatch, *targets: tuple) -> list[str]:
    """The names of the functions ``targets`` ((module, name) pairs) as they are called, in order (they still
    run)."""
    calls = []
    for module, name in targets:
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *args, _f=original, _n=name, **kwargs: calls.append(_n) or
                            _f(*args, **kwargs))
    return calls


@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
@pytest.mark.parametrize("seed", [None, 2**31 - 5], ids=["rne", "sr"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8", "mxfp8_e5m2"])
def test_grouped_quantizer_equals_each_group_alone(fmt, seed, rht):
    x = tokens()
    offs = torch.tensor(ENDS, dtype=torch.int32, device=DEVICE)
    step = torch.tensor(STEP, device=DEVICE)
    codes, scales, ts = quantize_row_groups_triton(x.to(DEVICE), get_format(fmt), offs, seed=seed, step=step, rht=rht)
    assert_each_group_alone(codes, scales, ts, x, fmt, seed, rht)


def assert_each_group_alone(codes, scales, ts, x, fmt, seed, rht) -> None:
    """Each group of ``ENDS`` in the grouped quantization (codes, scales, tensor scales) holds the bytes of
    quantizing it alone (``reference_groups``); an empty group's tensor scale is 1."""
    start = 0
    for g, (end, ref) in enumerate(zip(ENDS, reference_groups(x, fmt, seed, rht))):
        if ref is not None:
            assert bits_equal(codes[start:end].cpu(), ref.codes), f"{fmt} group {g} codes"
            assert bits_equal(scales[start:end].cpu(), ref.scales), f"{fmt} group {g} scales"
            if ts is not None:
                assert bits_equal(ts[g].cpu(), ref.tensor_scale), f"{fmt} group {g} tensor scale"
        elif ts is not None:
            assert ts[g].item() == 1.0  # an empty group's amax is 0: S_enc = S_dec = 1
        start = end


def test_grouped_amax_takes_each_groups_own_rows():
    """One huge value per group, placed so that a 64-row amax tile holds several groups: each group's tensor
    scale follows its own maximum, not its neighbours'."""
    x = torch.ones(76, 32)
    for g, (s, e) in enumerate(zip([0] + ENDS[:-1], ENDS)):
        if e > s:
            x[e - 1, 3] = 2.0 ** (4 * g)
    offs = torch.tensor(ENDS, dtype=torch.int32, device=DEVICE)
    _, _, ts = quantize_row_groups_triton(x.to(DEVICE), get_format("nvfp4"), offs, seed=None,
                                          step=torch.tensor(0, device=DEVICE))
    for g, (s, e) in enumerate(zip([0] + ENDS[:-1], ENDS)):
        if e > s:
            assert bits_equal(ts[g].cpu(), quantize_ref(x[s:e], "nvfp4", 1).tensor_scale)


def test_grouped_experts_gemm_runs_the_grouped_quantizers(monkeypatch):
    """A grouped 2d x 3d product under AUTOPREC_KERNELS=triton quantizes the tokens in one call and the expert
    weights in one (not one each per group) and equals the product in auto mode (each group quantized alone by
    the CPU kernels)."""
    a = torch.randn(70, 64)
    w = torch.randn(6, 64, 32)
    offs = torch.tensor(ENDS, dtype=torch.int32)
    opts = dict(rounding_a="sr", rounding_b="rne", seeds=(3, 4), step=torch.tensor(STEP), out_dtype=torch.float32)
    expected = grouped_mm(a, w, offs, "nvfp4", **opts)
    calls = record_calls(monkeypatch, (grouped_dispatch, "quantize_row_groups"),
                         (grouped_dispatch, "quantize_batches"), (dispatch, "quantize"))
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    got = grouped_mm(a, w, offs, "nvfp4", **opts)
    assert sorted(calls) == ["quantize_batches", "quantize_row_groups"]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_grouped_quantizer_with_many_uneven_groups():
    """37 experts (the lookup's power of two is 64), a third of them empty, in bf16 as a model's tokens are."""
    gen = torch.Generator().manual_seed(3)
    sizes = torch.randint(0, 12, (37,), generator=gen) * (torch.rand(37, generator=gen) > 0.33)
    ends = sizes.cumsum(0).tolist()
    x = (torch.randn(ends[-1] + 3, 32, generator=gen) * 10.0 ** torch.randint(-3, 4, (ends[-1] + 3, 1))).bfloat16()
    offs = torch.tensor(ends, dtype=torch.int32, device=DEVICE)
    codes, scales, ts = quantize_row_groups_triton(x.to(DEVICE), get_format("nvfp4"), offs, seed=11,
                                                   step=torch.tensor(STEP, device=DEVICE))
    for g, (s, e, ref) in enumerate(zip([0] + ends[:-1], ends, reference_groups(x, "nvfp4", 11, ends=ends))):
        if ref is not None:
            assert bits_equal(codes[s:e].cpu(), ref.codes) and bits_equal(scales[s:e].cpu(), ref.scales), g
            assert bits_equal(ts[g].cpu(), ref.tensor_scale), g


def batch_kernels() -> tuple:
    """(label, kernel) of the batch quantizers: slices for items blocked down a strided dim, else tiles."""
    q = quantize_grouped_triton
    return (("slices", q._nvfp4_batch_cols_kernel), ("tiles", q._nvfp4_batch_kernel),
            ("slices", q._mxfp8_batch_cols_kernel), ("tiles", q._mxfp8_batch_kernel))


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
@pytest.mark.parametrize("fmt,seed,tile2d", [("nvfp4", None, True), ("nvfp4", 7, False), ("mxfp8", 7, False),
                                             ("mxfp8_e5m2", None, False)])
def test_batched_expert_quantizer_equals_each_expert_alone(monkeypatch, fmt, seed, tile2d, layout):
    """Expert weights (E, K, N) blocked along K, every expert in one launch (read in place, also as the transposed
    view a dgrad passes, and as a view strided in both dims), against each expert quantized alone: its own tensor
    scale and SR stream. As they lie, K is a strided dim: the slice kernels (but for 16x16 tiles); the transposed
    view takes the tile kernels."""
    w = torch.stack([edge_tensor(64, 48, seed=e) * 1000.0 ** (e - 1) for e in range(3)])  # (3, K=64, N=48)
    if layout == "transposed":
        w = torch.stack([edge_tensor(48, 64, seed=e) * 1000.0 ** (e - 1) for e in range(3)]).transpose(1, 2)
    if layout == "strided":  # every other column of a (3, 64, 96) tensor
        w = torch.stack([edge_tensor(64, 96, seed=e) * 1000.0 ** (e - 1) for e in range(3)])[:, :, ::2]
    ran = []
    record_runs(monkeypatch, batch_kernels(), ran)
    codes, scales, ts = quantize_batches_triton(w.to(DEVICE), get_format(fmt), seed=seed,
                                                step=torch.tensor(STEP, device=DEVICE), tile2d=tile2d)
    assert ran == ["tiles" if layout == "transposed" or tile2d else "slices"]
    for e in range(3):
        rand = None if seed is None else sr_bits(w[e].shape, sr_stream(group_seed(seed, e), STEP))
        ref = quantize_ref(w[e], fmt, 0, rounding="rne" if seed is None else "sr", rand=rand, tile2d=tile2d)
        assert bits_equal(codes[e].cpu(), ref.codes) and bits_equal(scales[e].cpu(), ref.scales), e
        if ts is not None:
            assert bits_equal(ts[e].cpu(), ref.tensor_scale), e


@pytest.mark.parametrize("fmt,seed,rht", [("nvfp4", 7, True), ("nvfp4", None, False), ("mxfp8", 7, False)])
def test_batched_quantizer_of_transposed_items_equals_each_items_rows_alone(monkeypatch, fmt, seed, rht):
    """``sr_of_transpose``: the items x[e] (K, M) of a batch stored transposed (a 3d x 3d wgrad's aᵀ) quantized as
    their (M, K) rows alone would be, SR bits keyed on the rows' indices, bit for bit; the CPU path (one
    quantization per item) makes the same bytes."""
    rows = torch.stack([edge_tensor(48, 64, seed=e) * 1000.0 ** (e - 1) for e in range(3)])  # (3, M=48, K=64)
    x = rows.transpose(1, 2).contiguous().to(DEVICE)  # (3, K, M) as stored, unit stride along M
    got = grouped_dispatch.quantize_batches(x, fmt, rounding="rne" if seed is None else "sr", seed=seed or 0,
                                            step=STEP, rht=rht, rht_signs=None, sr_of_transpose=True)
    refs = reference_groups(rows.reshape(-1, 64), fmt, seed, rht, ends=[48, 96, 144])  # each item's rows alone
    for e, ref in enumerate(refs):
        assert bits_equal(got.codes[e].cpu(), ref.codes) and bits_equal(got.scales[e].cpu(), ref.scales), e
    monkeypatch.setattr(dispatch, "use_triton", lambda *args: False)
    cpu = grouped_dispatch.quantize_batches(x, fmt, rounding="rne" if seed is None else "sr", seed=seed or 0,
                                            step=STEP, rht=rht, sr_of_transpose=True)
    assert bits_equal(cpu.codes.cpu(), got.codes.cpu()) and bits_equal(cpu.scales.cpu(), got.scales.cpu())
    with pytest.raises(ValueError, match="tile2d"):
        grouped_dispatch.quantize_batches(x, fmt, tile2d=True, sr_of_transpose=True)


@pytest.mark.parametrize("fmt,rht", [("nvfp4", True), ("mxfp8", False)])
def test_pad_k_quantizes_as_the_zero_padded_copy(monkeypatch, fmt, rht):
    """``pad_k``: token groups and batch items whose K (40) is not whole blocks quantize as their zero-padded
    copies do, bit for bit, the zeros made in the kernels (the interpreter) and by a padded copy on the CPU path."""
    x, w = tokens()[:, :40].to(DEVICE), torch.randn(3, 40, 48, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    offs = torch.tensor(ENDS, dtype=torch.int32, device=DEVICE)
    opts = dict(rounding="sr", seed=9, step=STEP, rht=rht)
    pad = -40 % get_format(fmt).block_size
    padded = (grouped_dispatch.quantize_row_groups(torch.nn.functional.pad(x, (0, pad)), fmt, offs, **opts),
              grouped_dispatch.quantize_batches(torch.nn.functional.pad(w, (0, 0, 0, pad)), fmt, **opts))
    for triton_runs in (True, False):
        monkeypatch.setattr(dispatch, "use_triton", lambda *args, _on=triton_runs: _on)
        got = (grouped_dispatch.quantize_row_groups(x, fmt, offs, pad_k=True, **opts),
               grouped_dispatch.quantize_batches(w, fmt, pad_k=True, **opts))
        for g, want, rows in zip(got, padded, (slice(ENDS[-1]), slice(None))):  # rows past the last offset: unread
            assert g.shape == want.shape and bits_equal(g.codes[rows].cpu(), want.codes[rows].cpu())
            assert bits_equal(g.scales[rows].cpu(), want.scales[rows].cpu())
            assert g.tensor_scales is None or bits_equal(g.tensor_scales.cpu(), want.tensor_scales.cpu())


@pytest.mark.parametrize("config", tile_sweep(quantize_grouped_triton.NVFP4_CONFIGS))
def test_every_grouped_tile_matches_reference(monkeypatch, config):
    """Each tile a GPU may pick for the token-group and batch tile kernels (the interpreter runs the first alone),
    SR with RHT: token groups against each group alone, and batch items (a view with unit stride along K, which
    the tile kernels read) whose K (40) the kernel pads, against each item's zero-padded rows alone. On a GPU,
    MXFP8 only at the tiles it is tuned over."""
    q = quantize_grouped_triton
    force_tile(monkeypatch, (q._nvfp4_grouped_kernel, q._mxfp8_grouped_kernel, q._nvfp4_batch_kernel,
                             q._mxfp8_batch_kernel), config)
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")  # the Triton kernels, in the interpreter on a CPU
    mx_tuned = DEVICE == "cpu" or config in quantize_grouped_triton.MXFP8_CONFIGS
    x, offs = tokens(), torch.tensor(ENDS, dtype=torch.int32, device=DEVICE)
    for fmt in ("nvfp4", "mxfp8") if mx_tuned else ("nvfp4",):
        got = grouped_dispatch.quantize_row_groups(x.to(DEVICE), fmt, offs, rounding="sr", seed=3, step=STEP, rht=True)
        assert_each_group_alone(got.codes, got.scales, got.tensor_scales, x, fmt, 3, True)
        check_padded_batch(monkeypatch, fmt, contiguous=False)


@pytest.mark.parametrize("fmt,config", tile_sweep(slice_tile_cases()))
def test_every_batch_slice_tile_matches_reference(monkeypatch, fmt, config):
    """Batch items blocked down a strided dim (stored (E, K, M), unit stride along M) take the slice kernels: each
    of their GPU tiles forced, SR with RHT (NVFP4's amax pass in slices too), K (40) padded in the kernel, against
    each item's zero-padded rows alone."""
    q = quantize_grouped_triton
    force_tile(monkeypatch, (q._nvfp4_batch_cols_kernel, q._mxfp8_batch_cols_kernel), config)
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    check_padded_batch(monkeypatch, fmt, contiguous=True)


def check_padded_batch(monkeypatch, fmt: str, contiguous: bool) -> None:
    """Three items x[e] (K=40, M=48), 1000x apart, stored (E, K, M) (``contiguous``: the slice kernels) or as the
    transposed view of (E, M, K) (the tile kernels), quantized along K with SR keyed on xᵀ and RHT, K padded to
    whole blocks: each item equals its zero-padded rows quantized alone."""
    items = torch.stack([edge_tensor(48, 64, seed=e)[:, :40] * 1000.0 ** (e - 1) for e in range(3)])  # (E, M, K=40)
    stored = items.transpose(1, 2).contiguous() if contiguous else items.transpose(1, 2)
    ran = []
    record_runs(monkeypatch, batch_kernels(), ran)
    got = grouped_dispatch.quantize_batches(stored.to(DEVICE), fmt, rounding="sr", seed=3, step=STEP, rht=True,
                                            sr_of_transpose=True, pad_k=True)
    assert ran == ["slices" if contiguous else "tiles"]
    padded = torch.nn.functional.pad(items, (0, -40 % get_format(fmt).block_size))  # each item's rows, padded
    refs = reference_groups(padded.reshape(-1, padded.shape[-1]), fmt, 3, True, ends=[48, 96, 144])
    for e, ref in enumerate(refs):
        assert bits_equal(got.codes[e].cpu(), ref.codes) and bits_equal(got.scales[e].cpu(), ref.scales), (fmt, e)


def test_compiled_moe_training_step_runs_the_grouped_quantizers(monkeypatch, fresh_dynamo):
    """A compiled MoE block (nvfp4_nvidia: SR gradients, 16x16 expert tiles) under AUTOPREC_KERNELS=triton takes its
    step tensor into the grouped quantizers and runs its wgrads in one launch each, and its loss and gradients match
    auto mode's (the CPU kernels, group by group)."""
    from test_moe import MoEBlock

    def step(mode: str):
        monkeypatch.setenv("AUTOPREC_KERNELS", mode)
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = MoEBlock().bfloat16()
        compiled = torch.compile(model, backend="autoprec", options={"recipe": "nvfp4_nvidia", "inner": "aot_eager"})
        ids = torch.randint(0, 16, (95,), generator=torch.Generator().manual_seed(0))
        loss = compiled(ids).float().pow(2).mean()
        loss.backward()
        return loss.detach(), [p.grad for p in model.parameters()]

    loss_cpu, grads_cpu = step("auto")
    calls = record_calls(monkeypatch, (grouped_dispatch, "quantize_row_groups"),
                         (grouped_dispatch, "quantize_batches"), (grouped_dispatch, "wgrad_mm"))
    loss_triton, grads_triton = step("triton")
    assert calls.count("quantize_row_groups") == calls.count("quantize_batches") == 4  # fprop and dgrad, 2 GEMMs
    assert calls.count("wgrad_mm") == 2  # each experts GEMM's wgrad in one launch
    torch.testing.assert_close(loss_triton, loss_cpu)
    for got, want in zip(grads_triton, grads_cpu):
        torch.testing.assert_close(got, want, rtol=2**-7, atol=2**-7 * want.abs().max().item())
