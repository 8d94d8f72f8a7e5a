"""The precision plan: one Decision per GEMM (site x role), printable as a table."""
from __future__ import annotations

from dataclasses import dataclass, field

from autoprec.formats import get_format
from autoprec.roles import MatmulRole


@dataclass(frozen=True)
class Decision:
    """How one GEMM runs. ``module`` is the qualified name (root-relative once resolved by
    ``autoprec.plan``); ``shape`` is (M, N, K) of the GEMM with K the reduction; ``rounding`` applies to
    the gradient operand (weights and activations always round to nearest); ``seeds`` are the SR seeds
    of operands a and b."""

    site: int
    module: str
    role: MatmulRole
    shape: tuple[str, str, str]
    batch: str | None
    fmt: str
    rounding: str = "rne"
    rht: bool = False
    tile2d: bool = False
    reason: str = ""
    seeds: tuple[int, int] = (0, 0)
    rewritten: bool = True

    def __post_init__(self) -> None:
        get_format(self.fmt)

    @property
    def flops(self) -> str:
        m, n, k = self.shape
        batch = f"{self.batch}*" if self.batch else ""
        return f"2*{batch}{m}*{n}*{k}"


COLUMNS = ("site", "module", "role", "MxNxK", "format", "rounding", "RHT", "reason")


@dataclass
class Plan:
    """All decisions of a compiled model, plus what the partitioned graphs save for backward."""

    decisions: list[Decision] = field(default_factory=list)
    saved_bytes: dict[str, int] = field(default_factory=dict)
    not_compiled: list[str] = field(default_factory=list)

    def rows(self) -> list[tuple[str, ...]]:
        out = []
        for d in self.decisions:
            mnk = "x".join(d.shape) if not d.batch else f"{d.batch}*" + "x".join(d.shape)
            fmt = d.fmt + ("(16x16 W)" if d.tile2d else "")
            out.append((str(d.site), d.module or "<root>", str(d.role), mnk, fmt, d.rounding,
                        "yes" if d.rht else "-", d.reason))
        return out

    def role_counts(self) -> dict[str, int]:
        counts = {str(r): 0 for r in MatmulRole}
        for d in self.decisions:
            counts[str(d.role)] += 1
        return counts

    def __str__(self) -> str:
        rows = [COLUMNS, *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        for graph, nbytes in self.saved_bytes.items():
            lines.append(f"saved for backward ({graph}): {nbytes} bytes")
        if self.not_compiled:
            lines.append("ran outside autoprec (eager, e.g. after a graph break): " + ", ".join(self.not_compiled))
        return "\n".join(lines)
