"""Device arithmetic on a grouped GEMM's cumulative group ends ``offs`` (groups along the token dim), nothing read
on the host: group sizes, ends with each group padded to a multiple, and zeroing the output no group writes."""
from __future__ import annotations

import torch


def group_sizes(ends: torch.Tensor) -> torch.Tensor:
    """Each group's size from cumulative ends (any integer dtype, kept)."""
    return torch.diff(ends, prepend=ends.new_zeros(1))


def padded_ends(ends: torch.Tensor, multiple: int) -> torch.Tensor:
    """Cumulative ends of the groups with each group's size rounded up to ``multiple`` (``ends``' dtype)."""
    return ((group_sizes(ends) + multiple - 1) // multiple * multiple).cumsum(0).to(ends.dtype)


def zero_unwritten(out: torch.Tensor, offs: torch.Tensor | None, layout: str) -> torch.Tensor:
    """``out`` of a grouped kernel with what no group writes zeroed in place on the device: the rows past the last
    offset (2d x 3d), an empty group's product (2d x 2d)."""
    if layout == "2d3d":
        past_end = torch.arange(out.shape[0], device=out.device) >= offs[-1]
        out.masked_fill_(past_end.unsqueeze(1), 0)
    elif layout == "2d2d":
        out.masked_fill_((group_sizes(offs) == 0).view(-1, 1, 1), 0)
    return out
