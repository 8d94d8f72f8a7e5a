"""helpers.pairwise: the default run's cases of a parameter matrix cover every pair of values; the rest run slow.
helpers.tile_sweep: an interpreter tile sweep runs each format's first tile by default; the rest run slow."""
import itertools

import pytest
import torch

from helpers import pairwise, tile_sweep

triton = pytest.importorskip("triton")

AXES = ({"a": 0, "b": 1, "c": 2}, {"x": 0, "y": 1}, {"rne": 0, "sr": 1}, {"plain": 0, "rht": 1})


def test_default_cases_cover_every_pair_of_values_and_the_rest_are_slow():
    params = pairwise(*AXES)
    assert [p.id for p in params] == ["-".join(c) for c in itertools.product(*AXES)]
    default = [p.values for p in params if not p.marks]
    assert all([m.name for m in p.marks] == ["slow"] for p in params if p.marks)
    for i, j in itertools.combinations(range(len(AXES)), 2):
        assert {(v[i], v[j]) for v in default} == set(itertools.product(AXES[i].values(), AXES[j].values()))
    assert len(default) == 6  # 3 x 2 pairs need six cases; the greedy cover finds no more


def test_one_axis_runs_every_value():
    assert [(p.id, p.values, list(p.marks)) for p in pairwise({"a": 1, "b": 2})] == [("a", (1,), []), ("b", (2,), [])]


def test_tile_sweeps_run_each_formats_first_tile_by_default(monkeypatch):
    """In the interpreter each format's first tile runs by default, the rest slow; on a CUDA GPU every tile."""
    a, b, c = (triton.Config({"BR": br, "BK": 16}, num_warps=4) for br in (16, 32, 64))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    plain = tile_sweep([a, b])
    assert [(p.id, p.values, [m.name for m in p.marks]) for p in plain] == [("16x16w4", (a,), []),
                                                                           ("32x16w4", (b,), ["slow"])]
    paired = tile_sweep([("nvfp4", a), ("nvfp4", b), ("mxfp8", c)])
    assert [(p.id, [m.name for m in p.marks]) for p in paired] == [("nvfp4-16x16w4", []), ("nvfp4-32x16w4", ["slow"]),
                                                                   ("mxfp8-64x16w4", [])]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert [list(p.marks) for p in tile_sweep([("nvfp4", a), ("nvfp4", b)])] == [[], []]
