"""GEMMs whose shapes do not fit the blocks: 16x16 tiles fall back to 1x16, K off the block size to BF16,
each with the reason in the plan, under presets, auto and edited plan files."""
import json

import pytest
import torch
from torch import nn

import autoprec

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class MoeLike(nn.Module):
    """Hidden size 72 (not a multiple of 16) and a 4-way router."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.router = nn.Linear(64, 72), nn.Linear(72, 64), nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.router(torch.relu(self.down(torch.relu(self.up(x)))))


def moe_like() -> nn.Module:
    torch.manual_seed(0)
    return MoeLike()


def run(**options) -> autoprec.Plan:
    c = torch.compile(moe_like(), backend="autoprec", options=options)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        c(x).sum().backward()
    return autoprec.plan(c)


def rows(plan: autoprec.Plan) -> dict:
    return {(d.module, str(d.role)): d for d in plan.decisions}


def test_nvfp4_nvidia_tiles_fall_back_to_1x16():
    r = rows(run(recipe="nvfp4_nvidia"))
    for module in ("up", "router"):  # weights (72, 64) and (4, 64)
        d = r[module, "fprop"]
        assert d.fmt == "nvfp4" and not d.tile2d
        assert "16x16 tiles need both weight dims to be multiples of 16" in d.reason
        assert "1x16 blocks instead" in d.reason
    down = r["down", "fprop"]
    assert down.fmt == "bf16" and "K=72 is not a multiple of the nvfp4 block 16" in down.reason


def test_auto_bf16_rows_give_the_block_reason():
    d = rows(run())["down", "fprop"]
    assert d.fmt == "bf16"
    assert "K=72 is not a multiple of the nvfp4 block 16 and K=72 is not a multiple of the mxfp8 block 32" in d.reason


def test_edited_plan_with_tiles_on_odd_weight(tmp_path):
    plan = run(recipe="nvfp4")
    path = tmp_path / "plan.json"
    plan.save(path)
    data = json.loads(path.read_text())
    for d in data["decisions"]:
        d["tile2d"] = d["fmt"] == "nvfp4" and d["role"] != "wgrad"
    path.write_text(json.dumps(data))
    torch._dynamo.reset()
    r = rows(run(plan=str(path)))
    assert not r["router", "fprop"].tile2d and "1x16 blocks instead" in r["router", "fprop"].reason
