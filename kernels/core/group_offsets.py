"""Device arithmetic on a grouped GEMM's cumulative group ends ``offs`` (groups along the token dim), nothing read
on the host: group sizes, ends held to a valid partition, ends with each group padded to a multiple, where each
padded position's element comes from, and zeroing the output no group writes."""
from __future__ import annotations

import torch

GROUP_PAD = 128  # the grouped layouts pad each group's tokens to a multiple of this (every kernel tile divides it)


def padded_width(tokens: int, groups: int, multiple: int = GROUP_PAD) -> int:
    """The positions of ``tokens`` in ``groups`` groups each padded to ``multiple``, whatever their sizes."""
    return -(-tokens // multiple) * multiple + groups * multiple


def group_sizes(ends: torch.Tensor) -> torch.Tensor:
    """Each group's size from cumulative ends (any integer dtype, kept)."""
    return torch.diff(ends, prepend=ends.new_zeros(1))


def held_ends(ends: torch.Tensor, total: int) -> torch.Tensor:
    """``ends`` held to a partition of 0 .. ``total``: each end within it and at least the one before (a new tensor,
    ``ends``' dtype). Equal to ``ends`` where they are valid; for a kernel that trusts its offsets."""
    return torch.cummax(ends.clamp(0, total), 0).values


def padded_ends(ends: torch.Tensor, multiple: int) -> torch.Tensor:
    """Cumulative ends of the groups with each group's size rounded up to ``multiple`` (``ends``' dtype)."""
    return ((group_sizes(ends) + multiple - 1) // multiple * multiple).cumsum(0).to(ends.dtype)


def padded_sources(ends: torch.Tensor, multiple: int, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each of ``total`` positions of the groups ending at ``ends``, laid out one after the other each padded to
    ``multiple``: the index of its element in the unpadded dim, and whether it holds one (False on a group's
    padding and past the last group, where the index is out of range or another group's)."""
    ends = ends.long()
    sizes, ends_padded = group_sizes(ends), padded_ends(ends, multiple)
    at = torch.arange(total, device=ends.device)
    g = torch.bucketize(at, ends_padded, right=True).clamp_(max=ends.shape[0] - 1)  # each position's group
    within = at - (ends_padded - group_sizes(ends_padded))[g]
    return (ends - sizes)[g] + within, within < sizes[g]


def zero_unwritten(out: torch.Tensor, offs: torch.Tensor | None, layout: str) -> torch.Tensor:
    """``out`` of a grouped kernel with what no group writes zeroed in place on the device: the rows past the last
    offset (2d x 3d), an empty group's product (2d x 2d)."""
    if layout == "2d3d":
        past_end = torch.arange(out.shape[0], device=out.device) >= offs[-1]
        out.masked_fill_(past_end.unsqueeze(1), 0)
    elif layout == "2d2d":
        out.masked_fill_((group_sizes(offs) == 0).view(-1, 1, 1), 0)
    return out
