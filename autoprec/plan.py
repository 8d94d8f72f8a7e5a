"""The precision plan: one Decision per GEMM (site x role), its table, summary and JSON form."""
from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from autoprec.formats import get_format
from autoprec.roles import MatmulRole

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Decision:
    """How one GEMM runs.

    ``module`` is the qualified module name and ``index`` tells apart GEMMs of the same module and
    role (attention has two dgrads). ``shape`` is (M, N, K), K the reduction, as expressions in the
    symbolic sizes, as is ``flops_expr`` (``flops`` is its value at the traced sizes). ``rounding``
    applies to the gradient operand (weights and activations always round to nearest), ``tile2d`` to
    the weight. ``err``/``bias``/``loss`` are the calibrated scores of the
    chosen configuration; ``seconds`` and ``bf16_seconds`` its projected time and the BF16 time.
    """

    site: int
    module: str
    role: MatmulRole
    shape: tuple[str, str, str]
    batch: str | None
    fmt: str
    index: int = 0
    rounding: str = "rne"
    rht: bool = False
    tile2d: bool = False
    reason: str = ""
    seeds: tuple[int, int] = (0, 0)
    rewritten: bool = True
    flops: float = 0.0
    flops_expr: str = ""
    seconds: float = 0.0
    bf16_seconds: float = 0.0
    weight_elems: int = 0
    err: float | None = None
    bias: float | None = None
    loss: float | None = None

    def __post_init__(self) -> None:
        get_format(self.fmt)
        object.__setattr__(self, "role", MatmulRole(self.role))

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.module, str(self.role), self.index)

    @property
    def mnk(self) -> str:
        return (f"{self.batch}*" if self.batch else "") + "x".join(self.shape)

    def to_json(self) -> dict:
        d = asdict(self)
        d["role"] = str(self.role)
        return d

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Decision":
        valid = {f.name for f in fields(cls)}
        unknown = set(d) - valid
        if unknown:
            raise ValueError(f"{where}: unknown decision field(s) {sorted(unknown)}; valid: {sorted(valid)}")
        try:
            return cls(**{**d, "shape": tuple(d["shape"]), "seeds": tuple(d.get("seeds", (0, 0)))})
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from exc


COLUMNS = ("site", "module", "role", "MxNxK", "format", "rounding", "RHT", "err", "bias", "loss", "reason")


def _score(v: float | None) -> str:
    return "-" if v is None else f"{v:.1e}"


@dataclass
class Plan:
    """All decisions of a compiled model, what its graphs save for backward, and its projections."""

    decisions: list[Decision] = field(default_factory=list)
    saved_bytes: dict[str, int] = field(default_factory=dict)
    not_compiled: list[str] = field(default_factory=list)
    hardware: str = "gb300"
    pass_seconds: dict[str, float] = field(default_factory=dict)

    def rows(self) -> list[tuple[str, ...]]:
        return [
            (str(d.site), d.module or "<root>", str(d.role), d.mnk, d.fmt + (" 16x16" if d.tile2d else ""),
             d.rounding if d.fmt != "bf16" else "-", "yes" if d.rht else "-", _score(d.err), _score(d.bias),
             _score(d.loss), d.reason)
            for d in self.decisions
        ]

    def role_counts(self) -> dict[str, int]:
        counts = {str(r): 0 for r in MatmulRole}
        for d in self.decisions:
            counts[str(d.role)] += 1
        return counts

    def flop_share(self) -> dict[str, float]:
        total = sum(d.flops for d in self.decisions) or 1.0
        share: dict[str, float] = {}
        for d in self.decisions:
            share[d.fmt] = share.get(d.fmt, 0.0) + d.flops / total
        return share

    def projected_speedup(self) -> float:
        """GEMM time of the all-BF16 plan over this plan's, on the cost model's hardware."""
        mine = sum(d.seconds for d in self.decisions)
        return sum(d.bf16_seconds for d in self.decisions) / mine if mine else 1.0

    def weight_bytes(self) -> tuple[float, float]:
        """Bytes of the weights as their fprop GEMMs read them, and the same in BF16."""
        fp = [d for d in self.decisions if d.role is MatmulRole.FPROP and d.weight_elems]
        return (sum(d.weight_elems * get_format(d.fmt).bits_per_value / 8 for d in fp),
                sum(d.weight_elems * 2.0 for d in fp))

    def summary(self) -> str:
        share = ", ".join(f"{fmt} {100 * s:.0f}%" for fmt, s in sorted(self.flop_share().items()))
        wq, wb = self.weight_bytes()
        text = (f"FLOPs: {share}; projected GEMM speedup vs BF16 on {self.hardware}: "
                f"{self.projected_speedup():.2f}x; weights {wq / 1e6:.3f} MB (BF16 {wb / 1e6:.3f} MB)")
        if self.saved_bytes:
            text += f"; saved for backward {sum(self.saved_bytes.values()) / 1e6:.3f} MB"
        return text

    def __str__(self) -> str:
        from rich.console import Console
        from rich.table import Table

        table = Table(*COLUMNS, box=None, pad_edge=False, header_style="bold")
        for row in self.rows():
            table.add_row(*row)
        console = Console(record=True, width=250, file=io.StringIO(), color_system=None)
        console.print(table)
        lines = [console.export_text().rstrip(), self.summary()]
        if self.not_compiled:
            lines.append("ran outside autoprec (eager, e.g. after a graph break): " + ", ".join(self.not_compiled))
        if self.pass_seconds:
            lines.append("pass times: " + ", ".join(f"{k} {v:.3f}s" for k, v in self.pass_seconds.items()))
        return "\n".join(lines)

    def save(self, path: str | Path) -> None:
        data = {"schema_version": SCHEMA_VERSION, "hardware": self.hardware,
                "decisions": [d.to_json() for d in self.decisions]}
        Path(path).write_text(json.dumps(data, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        where = str(path)
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"plan file {where}: cannot read it: {exc}") from exc
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"plan file {where}: schema_version {data.get('schema_version')!r}, "
                             f"this autoprec reads {SCHEMA_VERSION}")
        decisions = [Decision.from_json(d, f"plan file {where}, decision {i}") for i, d in enumerate(data["decisions"])]
        return cls(decisions=decisions, hardware=data.get("hardware", "gb300"))
