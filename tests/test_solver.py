"""The multiple-choice knapsack solver against brute force on small random instances."""
import itertools
import random

import pytest

from autoprec.planner.solver import grid_cost, solve_mckp


def brute_force(items, limit, resolution):
    best = None
    for combo in itertools.product(*[range(len(opts)) for opts in items]):
        cost = sum(grid_cost(items[i][j][1], limit, resolution) for i, j in enumerate(combo))
        if cost > resolution:
            continue
        obj = sum(items[i][j][0] for i, j in enumerate(combo))
        if best is None or obj < best[0] - 1e-12:
            best = (obj, combo)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_optimal_against_brute_force(seed):
    rng = random.Random(seed)
    n_items = rng.randint(1, 6)
    items = [[(rng.uniform(0, 10), rng.uniform(0, 3)) for _ in range(rng.randint(1, 4))] for _ in range(n_items)]
    limit = rng.uniform(0.5, 8)
    resolution = 200
    got = solve_mckp(items, limit, resolution)
    want = brute_force(items, limit, resolution)
    if want is None:
        assert got is None
        return
    assert got is not None
    obj = sum(items[i][j][0] for i, j in enumerate(got))
    assert obj == pytest.approx(want[0], abs=1e-9)
    assert sum(items[i][j][1] for i, j in enumerate(got)) <= limit + 1e-9  # the real budget holds


def test_deterministic_and_tie_break():
    items = [[(1.0, 0.0), (1.0, 0.0)], [(2.0, 1.0), (0.0, 5.0)]]
    assert solve_mckp(items, 2.0) == [0, 0]
    assert solve_mckp(items, 10.0) == [0, 1]
    assert solve_mckp(items, 10.0) == solve_mckp(items, 10.0)


def test_infeasible_and_empty():
    assert solve_mckp([[(0.0, 5.0)]], 1.0) is None
    assert solve_mckp([], 1.0) == []
    assert solve_mckp([[(3.0, 0.0), (1.0, 0.1)]], 0.0) == [0]
