"""The three GEMMs of y = x·Wᵀ (DESIGN.md §2)."""
from __future__ import annotations

from enum import Enum


class MatmulRole(str, Enum):
    """fprop: Y = X·Wᵀ; dgrad: dX = dY·W; wgrad: dW = dYᵀ·X (activation x activation: fprop, dgrad)."""

    FPROP = "fprop"
    DGRAD = "dgrad"
    WGRAD = "wgrad"

    def __str__(self) -> str:
        return self.value
