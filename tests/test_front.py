"""The speed-damage front of one calibration (``autoprec.front``): the solver run again at several projected
at-scale speedups, no step run again."""
import pytest
import torch

import autoprec
from autoprec.planner.front import Front

from gpt_model import TinyGPT, tokens


def calibrated(recipe: str = "auto", **options) -> torch.nn.Module:
    torch.manual_seed(0)
    model = TinyGPT(vocab=64, d=64, layers=2, heads=2, ctx=32)
    compiled = torch.compile(model, backend="autoprec", options={"recipe": recipe, **options})
    compiled(*tokens(batch=8, ctx=32, vocab=64)).backward()
    return compiled


def test_front_trades_damage_for_speed_from_one_calibration(tmp_path):
    """From all-but-BF16 at 1x to mostly NVFP4 near the fastest plan: the projected at-scale speedups meet their
    targets and rise, the least damage the solver finds rises with them, and the PNG is written."""
    compiled = calibrated()
    front = autoprec.front(compiled, points=6)
    assert isinstance(front, Front) and len(front.points) >= 4
    speeds = [p.at_scale for p in front.points]
    damages = [p.damage for p in front.points]
    assert all(p.at_scale >= p.target * (1 - 1e-6) for p in front.points)
    assert speeds == sorted(speeds) and speeds[-1] > 1.5
    assert damages[0] == min(damages) and damages[-1] == max(damages) and damages[-1] > 10 * damages[0]
    assert front.points[0].shares.get("bf16", 0) > 0.5 and front.points[-1].shares.get("nvfp4", 0) > 0.5
    assert str(front).splitlines()[0].split()[:3] == ["target", "at", "scale"]
    front.plot(str(tmp_path / "front.png"))
    assert (tmp_path / "front.png").read_bytes()[:4] == b"\x89PNG"


def test_front_keeps_what_the_options_force():
    """Overrides are checked against the model's module tree, as at compile time (a rule may name a module that
    runs no GEMM itself, a LayerNorm), and the GEMMs they force stay BF16 at every point of the front."""
    compiled = calibrated(overrides={"blocks.0.*": {"fprop": "bf16"}, "blocks.0.ln1": {"fprop": "bf16"}})
    front = autoprec.front(compiled, points=3)
    assert len(front.points) >= 2 and all(p.shares.get("bf16", 0) > 0.2 for p in front.points)


def test_front_needs_an_auto_calibration():
    with pytest.raises(ValueError, match="recipe 'auto' that has calibrated"):
        autoprec.front(calibrated("nvfp4"))
    with pytest.raises(ValueError, match="points must be at least 2"):
        autoprec.front(calibrated(), points=1)
