"""Host-side arithmetic of the Triton launches (grids), kept in plain Python: ``triton.cdiv`` is a constexpr
function in Triton 3.9, whose argument unwrapping costs about 2 us per host call, several per launch; and whether
the launches run in Triton's interpreter."""
from __future__ import annotations

import os


def cdiv(a: int, b: int) -> int:
    """``a / b`` rounded up, for positive ``b``."""
    return -(-a // b)


def interpreting() -> bool:
    """Whether Triton's kernels run in its interpreter (``TRITON_INTERPRET=1``) rather than on a GPU."""
    return os.environ.get("TRITON_INTERPRET") == "1"
