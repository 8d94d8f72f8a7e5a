"""Analysis pass: group the fprop / dgrad / wgrad matmuls of one layer into a site."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch.fx as fx

from autoprec.passes.classify_roles import RoleInfo
from autoprec.roles import MatmulRole


@dataclass
class Site:
    """One matmul of the model (a linear layer, or an activation x activation product) with the
    GEMMs autograd made of it. ``index`` orders sites by their forward position."""

    index: int
    module_id: str | None
    module_path: str
    module_type: str
    sdpa: bool
    weight: fx.Node | None
    stack_ids: tuple[str, ...] = ()
    gemms: list[RoleInfo] = field(default_factory=list)
    problem: str | None = None  # why its GEMMs could not be tied to a layer: they run in BF16

    def role_counts(self) -> dict[MatmulRole, int]:
        counts = {r: 0 for r in MatmulRole}
        for info in self.gemms:
            counts[info.role] += 1
        return counts


def group_sites(infos: list[RoleInfo]) -> list[Site]:
    """Forward matmuls open sites; backward ones join the site whose forward op has their seq_nr.

    The dataflow roles are checked against that pairing: a wgrad or weight dgrad must belong to a
    forward matmul that reads the same parameter. One that does not (e.g. the forward read an indexed
    or gathered weight) gets a site of its own with the ``problem`` stated.
    """
    sites: list[Site] = []
    by_seq: dict[int, Site] = {}
    for info in infos:
        mm = info.mm
        if info.role is MatmulRole.FPROP:
            site = Site(len(sites), mm.module_id, mm.module_path, mm.module_type, mm.sdpa, info.weight_placeholder,
                        mm.stack_ids)
            site.gemms.append(info)
            sites.append(site)
            if mm.seq_nr is not None:
                by_seq.setdefault(mm.seq_nr, site)
            continue
        site = by_seq.get(mm.seq_nr) if mm.seq_nr is not None else None
        problem = _pairing_problem(info, site) if site is not None else None
        if site is None or problem:
            site = Site(len(sites), mm.module_id, mm.module_path, mm.module_type, mm.sdpa, info.weight_placeholder,
                        mm.stack_ids, problem=problem)
            sites.append(site)
        site.gemms.append(info)
    return sites


def _pairing_problem(info: RoleInfo, site: Site) -> str | None:
    """Why a backward GEMM cannot join the site of its forward matmul (None when it can)."""
    if info.weight_placeholder is None and info.role is not MatmulRole.WGRAD:
        return None
    if site.weight is None:
        return (f"{info.role} of a forward matmul that reads no weight parameter directly "
                "(an indexed or gathered weight?): not tied to a layer")
    if info.weight_placeholder is not None and info.weight_placeholder is not site.weight:
        return f"{info.role} reads another weight than its forward matmul: not tied to a layer"
    return None
