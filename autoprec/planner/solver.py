"""Exact multiple-choice knapsack: pick one option per item.

``maximise speed``: minimise total time subject to total damage <= budget. ``minimise damage``:
minimise total damage subject to total time <= a limit. Costs of the constraint are rounded *up*
onto an integer grid of ``resolution`` steps of the limit, so the dynamic programme is exact on that
grid and the real constraint is never exceeded. Ties go to the lowest option index: deterministic.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Option = tuple[float, float]  # (objective, constraint cost)


def solve_mckp(items: Sequence[Sequence[Option]], limit: float, resolution: int = 2000) -> list[int] | None:
    """Indices (one per item) minimising the summed objective with summed cost <= ``limit``; None if
    even the cheapest choice per item breaks the limit."""
    if not items:
        return []
    if limit < 0:
        return None
    unit = limit / resolution if limit > 0 else 1.0
    cap = resolution if limit > 0 else 0
    weights = [[_grid(cost, unit) for _, cost in opts] for opts in items]
    best = np.full(cap + 1, np.inf)  # best[w]: least objective at grid cost exactly w
    best[0] = 0.0
    choice = []
    for opts, ws in zip(items, weights):
        cand = np.full((len(opts), cap + 1), np.inf)
        for j, ((obj, _), wj) in enumerate(zip(opts, ws)):
            if wj <= cap:
                cand[j, wj:] = best[: cap + 1 - wj] + obj
        pick = np.argmin(cand, axis=0)  # first minimum: the lowest option index wins ties
        best = cand[pick, np.arange(cap + 1)]
        choice.append(pick)
    if not np.isfinite(best).any():
        return None
    end = int(np.argmin(best))
    return _backtrack(weights, choice, end)


def _grid(cost: float, unit: float) -> int:
    return max(0, math.ceil(cost / unit - 1e-9))


def _backtrack(weights: list[list[int]], choice: list[np.ndarray], end: int) -> list[int]:
    out = []
    w = end
    for i in range(len(weights) - 1, -1, -1):
        j = int(choice[i][w])
        out.append(j)
        w -= weights[i][j]
    return out[::-1]


def grid_cost(cost: float, limit: float, resolution: int = 2000) -> int:
    """The integer cost the solver charges (for checking solutions against brute force)."""
    unit = limit / resolution if limit > 0 else 1.0
    return _grid(cost, unit)
