"""Host-side arithmetic of the Triton launches (grids), kept in plain Python: ``triton.cdiv`` is a constexpr
function in Triton 3.9, whose argument unwrapping costs about 2 us per host call, several per launch."""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """``a / b`` rounded up, for positive ``b``."""
    return -(-a // b)
