"""FP8 block scaling end to end: the ``fp8_block`` recipe's compiled loss and gradients bit for bit against an
eager reference that quantizes the same operands (1x128 blocks, 128x128 weight tiles), its plan, shapes its blocks
do not fit, an override naming it, and the experts GEMMs it does not run."""
import pytest
import torch
from test_compile_numerics import grads

import autoprec

from gpt_model import MLP, MoE
from helpers import bits_equal
from reference_autograd import qlinear

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_recipe_loss_and_grads_equal_reference():
    torch.manual_seed(0)
    m = MLP(d=128, h=256)
    x = torch.randn(2, 64, 128)
    c = torch.compile(m, backend="autoprec", options={"recipe": "fp8_block"})
    loss = c(x).pow(2).mean()
    loss.backward()
    got = grads(m)
    want = qlinear(torch.nn.functional.gelu(qlinear(x, m.fc1, "fp8_block")), m.fc2, "fp8_block").pow(2).mean()
    want.backward()
    assert bits_equal(loss.detach(), want.detach())
    for g, w in zip(got, grads(m)):
        assert bits_equal(g, w)
    rows = {(d.module, str(d.role)): d for d in autoprec.plan(c).decisions}
    assert {d.fmt for d in rows.values()} == {"fp8_block"}
    assert rows["fc2", "fprop"].tile2d and rows["fc2", "dgrad"].tile2d and not rows["fc2", "wgrad"].tile2d
    assert "fp8_block 128x128" in str(autoprec.plan(c))


def test_blocks_that_do_not_fit_run_bf16_and_say_why():
    """A reduction of 96 takes no 128-blocks (BF16, said so); a 64-row weight takes no 128x128 tiles (1x128 blocks,
    said so)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(96, 64), torch.nn.GELU(), torch.nn.Linear(64, 128))
    c = torch.compile(m, backend="autoprec", options={"recipe": "fp8_block"})
    c(torch.randn(128, 96)).sum().backward()
    rows = {(d.module, str(d.role)): d for d in autoprec.plan(c).decisions}
    assert rows["0", "fprop"].fmt == "bf16" and "K=96 is not a multiple of the fp8_block block 128" in rows[
        "0", "fprop"].reason
    dgrad = rows["2", "dgrad"]  # dY (128, 128) · W (128, 64): K=128 fits, W's 64 rows take no tiles
    assert dgrad.fmt == "fp8_block" and not dgrad.tile2d and "128x128 tiles need both weight dims" in dgrad.reason


def test_override_names_fp8_block_on_a_blackwell_plan():
    """Blackwell's menu leaves FP8-block out of auto's choices, and an override still runs it."""
    torch.manual_seed(0)
    m = MLP(d=128, h=256)
    c = torch.compile(m, backend="autoprec", options={"recipe": "auto", "overrides": {"fc2": "fp8_block"}})
    for _ in range(2):
        c(torch.randn(2, 64, 128)).pow(2).mean().backward()
    rows = {(d.module, str(d.role)): d for d in autoprec.plan(c).decisions}
    assert all(rows["fc2", r].fmt == "fp8_block" for r in ("fprop", "dgrad", "wgrad"))
    assert rows["fc2", "fprop"].tile2d
    assert all(d.fmt != "fp8_block" for d in rows.values() if d.module == "fc1")


def test_experts_gemms_do_not_run_fp8_block_and_say_why():
    torch.manual_seed(0)
    m = MoE(d=128, h=256, experts=4)
    c = torch.compile(m, backend="autoprec", options={"recipe": "fp8_block"})
    c(torch.randn(2, 32, 128)).pow(2).mean().backward()
    experts = [d for d in autoprec.plan(c).decisions if d.groups]
    assert experts and all(d.fmt == "bf16" and "grouped (experts) GEMMs run nvfp4" in d.reason for d in experts)


def test_a_weight_is_quantized_once_for_fprop_and_dgrad(monkeypatch):
    """The dgrad reads the transpose of the fprop's 128x128-tiled weight (``transpose_tiles``), bit for bit what
    quantizing it again would give: one weight quantization per step instead of two."""
    from autoprec.kernels.dispatch import dense as dispatch
    from autoprec.kernels.ops import transpose_tiles

    w = torch.randn(256, 384) * torch.logspace(-3, 3, 384)
    w[5, 9] = float("nan")
    fprop = dispatch.quantize(w.t(), "fp8_block", 0, tile2d=True)  # b = Wᵀ, stored (256, 384)
    dgrad = dispatch.quantize(w, "fp8_block", 0, tile2d=True)  # b = W, stored (384, 256)
    codes, scales = transpose_tiles(fprop.codes.view(torch.uint8), fprop.scales.view(torch.uint8), "fp8_block")
    assert bits_equal(codes, dgrad.codes.view(torch.uint8)) and bits_equal(scales, dgrad.scales.view(torch.uint8))
    torch.library.opcheck(torch.ops.autoprec.transpose_tiles.default,
                          (fprop.codes.view(torch.uint8), fprop.scales.view(torch.uint8), "fp8_block"))

    quantized = []
    real = dispatch.quantize
    monkeypatch.setattr(dispatch, "quantize", lambda x, fmt, *a, **k: quantized.append(
        (tuple(x.shape), k.get("tile2d"))) or real(x, fmt, *a, **k))
    torch.manual_seed(0)
    m = MLP(d=128, h=256)
    c = torch.compile(m, backend="autoprec", options={"recipe": "fp8_block"})
    c(torch.randn(2, 64, 128, requires_grad=True)).pow(2).mean().backward()
    assert sorted(shape for shape, tiles in quantized if tiles) == [(128, 256), (256, 128)], quantized  # once each
