"""The kernel mode chosen by ``AUTOPREC_KERNELS`` (read in one place, validated)."""
from __future__ import annotations

import os

MODES = ("auto", "triton", "ref", "ref_inductor")


def kernel_mode() -> str:
    mode = os.environ.get("AUTOPREC_KERNELS", "auto").lower()
    if mode not in MODES:
        raise ValueError(f"AUTOPREC_KERNELS={mode!r} is not valid; use one of {', '.join(MODES)}")
    return mode
