"""helpers.pairwise: the default run's cases of a parameter matrix cover every pair of values; the rest run slow."""
import itertools

from helpers import pairwise

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
