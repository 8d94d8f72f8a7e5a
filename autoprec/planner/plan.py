"""The precision plan: one Decision per GEMM (site x role), its table, summary and JSON form."""
from __future__ import annotations

import io
import json
import math
import re
import textwrap
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from autoprec.formats import FORMATS, get_format
from autoprec.quant_spec import Rounding, values
from autoprec.roles import MatmulRole

from .cost import HARDWARE, get_hardware

SCHEMA_VERSION = 4  # 2 added weight_shape, 3 groups / group_tokens, 4 input_amax; older files still load
READABLE_VERSIONS = (1, 2, 3, 4)
REQUIRED = ("site", "module", "role", "shape", "batch", "fmt")


def is_int(v) -> bool:
    """An int that is not a bool (JSON and option values)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_real(v) -> bool:
    """An int or float that is not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# field -> (check, what a valid value is)
FIELD_RULES = {
    "site": (is_int, "an int"),
    "module": (lambda v: isinstance(v, str), "a module path string"),
    "role": (lambda v: v in tuple(str(r) for r in MatmulRole), "one of fprop, dgrad, wgrad"),
    "shape": (lambda v: isinstance(v, (list, tuple)) and len(v) == 3 and all(isinstance(x, (str, int)) for x in v),
              "[M, N, K]"),
    "batch": (lambda v: v is None or isinstance(v, (str, int)), "a size or null"),
    "fmt": (lambda v: v in FORMATS, f"one of {', '.join(FORMATS)}"),
    "index": (is_int, "an int"),
    "rounding": (lambda v: v in values(Rounding), f"one of {', '.join(values(Rounding))}"),
    "rht": (lambda v: isinstance(v, bool), "true or false"),
    "tile2d": (lambda v: isinstance(v, bool), "true or false"),
    "reason": (lambda v: isinstance(v, str), "a string"),
    "seeds": (lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(map(is_int, v)), "[int, int]"),
    "rewritten": (lambda v: isinstance(v, bool), "true or false"),
    "flops": (is_real, "a number"),
    "flops_expr": (lambda v: isinstance(v, str), "a string"),
    "seconds": (is_real, "a number"),
    "bf16_seconds": (is_real, "a number"),
    "weight_elems": (is_int, "an int"),
    "weight_shape": (lambda v: v is None or (isinstance(v, (list, tuple)) and all(map(is_int, v))),
                     "a list of ints or null"),
    "graphs": (lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v), "a list of graph names"),
    "ref_seconds": (is_real, "a number"),
    "ref_bf16_seconds": (is_real, "a number"),
    "err": (lambda v: v is None or is_real(v), "a number or null"),
    "bias": (lambda v: v is None or is_real(v), "a number or null"),
    "loss": (lambda v: v is None or is_real(v), "a number or null"),
    "groups": (lambda v: v is None or (is_int(v) and v > 0), "a positive int or null"),
    "group_tokens": (lambda v: v is None or (isinstance(v, (list, tuple)) and all(map(is_real, v))),
                     "a list of numbers or null"),
    "group_err": (lambda v: v is None or (isinstance(v, (list, tuple)) and all(map(is_real, v))),
                  "a list of numbers or null"),
    "input_amax": (lambda v: v is None or (isinstance(v, (list, tuple)) and len(v) == 2 and all(
        x is None or (is_real(x) and math.isfinite(x) and x >= 0) for x in v)), "[a, b] of finite amaxes >= 0 or "
                   "nulls, or null"),
}


@dataclass(frozen=True)
class Decision:
    """How one GEMM runs.

    ``module`` is the qualified module name and ``index`` tells apart GEMMs of the same module and
    role (attention has two dgrads). ``shape`` is (M, N, K), K the reduction, as expressions in the
    symbolic sizes, as is ``flops_expr`` (``flops`` is its value at the traced sizes). ``rounding``
    applies to the gradient operand (weights and activations always round to nearest), ``tile2d`` to
    the weight. ``err``/``bias``/``loss`` are the calibrated scores of the
    chosen configuration; ``seconds`` and ``bf16_seconds`` its projected time and the BF16 time at the
    traced shapes (roofline), ``ref_seconds`` and ``ref_bf16_seconds`` at the reference shapes (at_scale.py).
    A grouped (experts) GEMM has ``groups`` experts, each group quantized on its own, and
    ``group_tokens``: each expert's mean token count in calibration (what ``seconds`` is costed at), and
    ``group_err``: each expert's relative error in the chosen configuration. ``input_amax``: the static NVFP4
    tensor amax of each operand (a, b) whose scale is fixed (the RL phases' activations: ``docs/rl.md``), None
    for an operand scaled by its own amax.
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
    weight_shape: tuple[int, ...] | None = None
    ref_seconds: float = 0.0
    ref_bf16_seconds: float = 0.0
    graphs: tuple[str, ...] = ()
    err: float | None = None
    bias: float | None = None
    loss: float | None = None
    groups: int | None = None
    group_tokens: tuple[float, ...] | None = None
    group_err: tuple[float, ...] | None = None
    input_amax: tuple[float | None, float | None] | None = None

    def __post_init__(self) -> None:
        for name, (ok, valid) in FIELD_RULES.items():
            value = getattr(self, name)
            if not ok(str(value) if name == "role" else value):
                raise ValueError(f"field {name!r} = {value!r} is not valid; expected {valid}")
        object.__setattr__(self, "role", MatmulRole(self.role))

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.module, str(self.role), self.index)

    @property
    def mnk(self) -> str:
        experts = f"{self.groups} experts: " if self.groups else ""
        return experts + (f"{self.batch}*" if self.batch else "") + "x".join(self.shape)

    def to_json(self) -> dict:
        d = asdict(self)
        d["role"] = str(self.role)
        return d

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Decision":
        if not isinstance(d, dict):
            raise ValueError(f"{where}: a decision must be a JSON object, got {type(d).__name__}")
        if isinstance(d.get("module"), str) and isinstance(d.get("role"), str):
            where = f"{where} ({d['module'] or '<root>'} {d['role']})"
        valid = {f.name for f in fields(cls)}
        unknown = set(d) - valid
        if unknown:
            raise ValueError(f"{where}: unknown decision field(s) {sorted(unknown)}; valid: {sorted(valid)}")
        missing = [k for k in REQUIRED if k not in d]
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}; a decision needs {', '.join(REQUIRED)}")
        listed = ("shape", "seeds", "weight_shape", "graphs", "group_tokens", "group_err", "input_amax")
        tuples = {k: tuple(d[k]) for k in listed if isinstance(d.get(k), list)}
        try:
            return cls(**{**d, **tuples})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from exc


COLUMNS = ("site", "module", "role", "MxNxK", "format", "rounding", "RHT", "err", "bias", "loss", "graphs", "reason")
SHORT_COLUMNS = ("module", "role", "MxNxK", "format", "round", "RHT", "graphs", "reason")
WIDTH = 120  # the default view fits a terminal; ``Plan.details()`` has every field in full
MIN_REASON = 28


def short_reason(reason: str) -> str:
    """A reason's first clause without its parenthesized detail: ``auto (fastest within budget ...): damage 5.4e-06;
    others ...`` reads ``auto: damage 5.4e-06``."""
    return re.sub(r" \([^()]*\)", "", reason.split("; ")[0])


def _cells(d: "Decision") -> dict[str, str]:
    """Every cell a plan table can show for ``d``, by ``COLUMNS`` name."""
    return {"site": str(d.site), "module": d.module or "<root>", "role": str(d.role), "MxNxK": d.mnk,
            "format": d.fmt + (f" {_tile(d.fmt)}" if d.tile2d else ""),
            "rounding": d.rounding if d.fmt != "bf16" else "-",
            "RHT": "yes" if d.rht else "-", "err": _score(d.err), "bias": _score(d.bias), "loss": _score(d.loss),
            "graphs": ",".join(d.graphs) or "-", "reason": d.reason}


def _tile(fmt: str) -> str:
    side = get_format(fmt).tile
    return f"{side}x{side}"


def _fit(text: str, width: int, keep_end: bool = False) -> str:
    """``text`` cut to ``width`` characters with an ellipsis (at the start where its end matters more)."""
    if len(text) <= width:
        return text
    return "…" + text[len(text) - width + 1:] if keep_end else text[:width - 1] + "…"


def _score(v: float | None) -> str:
    return "-" if v is None else f"{v:.1e}"


@dataclass
class Plan:
    """All decisions of a compiled model, what its graphs save for backward, and its projections."""

    decisions: list[Decision] = field(default_factory=list)
    saved_bytes: dict[str, int] = field(default_factory=dict)
    not_compiled: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what else the user should know: eager code, ignored annotations
    unplanned_ops: list[tuple[str, str, float | None]] = field(default_factory=list)  # (module, op, FLOPs)
    unplanned_params: list[tuple[str, str]] = field(default_factory=list)  # (parameter, why no GEMM reads it)
    hardware: str = "gb300"
    pass_seconds: dict[str, float] = field(default_factory=dict)
    schedule: list[str] = field(default_factory=list)  # one line per precision phase (option ``schedule``)
    reference: str = ""  # the at-scale projection's reference shapes and rates

    def rows(self) -> list[tuple[str, ...]]:
        """Every decision's cells in ``COLUMNS`` order (the full table)."""
        return [tuple(_cells(d)[c] for c in COLUMNS) for d in self.decisions]

    def short_rows(self) -> list[tuple[str, ...]]:
        """Every decision's cells in ``SHORT_COLUMNS`` order: a module's later GEMMs of a role marked ``#n``, the
        reason's first clause."""
        out = []
        for d in self.decisions:
            cells = _cells(d)
            cells.update(role=cells["role"] + (f"#{d.index}" if d.index else ""), round=cells["rounding"],
                         reason=short_reason(d.reason))
            out.append(tuple(cells[c] for c in SHORT_COLUMNS))
        return out

    def experts_lines(self) -> list[str]:
        """One line per experts module: its expert count and the tokens each expert saw in calibration."""
        lines, seen = [], set()
        for d in self.decisions:
            if not d.groups or d.module in seen or str(d.role) != "fprop":
                continue
            seen.add(d.module)
            tokens = (", ".join(f"{t:.0f}" for t in d.group_tokens) if d.group_tokens
                      else "not measured (costed as an even split)")
            lines.append(f"experts {d.module or '<root>'}: {d.groups} experts, each group quantized on its own "
                         f"(NVFP4: a tensor scale per expert; wgrad token groups zero-padded to whole blocks); "
                         f"tokens per expert in calibration: {tokens}")
            errs = [f"{r.role} {r.fmt} " + "/".join(f"{e:.1e}" for e in r.group_err)
                    for r in self.decisions if r.module == d.module and r.group_err]
            if errs:
                lines.append("  err per expert: " + "; ".join(errs))
        return lines

    def role_counts(self) -> dict[str, int]:
        counts = {str(r): 0 for r in MatmulRole}
        for d in self.decisions:
            counts[str(d.role)] += 1
        return counts

    def flop_share(self) -> dict[str, float]:
        """Share of the GEMM FLOPs seen per format, matmul-like ops autoprec left as traced counted as
        ``not planned`` (where their shapes tell their FLOPs)."""
        unplanned = sum(f for _, _, f in self.unplanned_ops if f is not None)
        total = (sum(d.flops for d in self.decisions) + unplanned) or 1.0
        share: dict[str, float] = {"not planned": unplanned / total} if unplanned else {}
        for d in self.decisions:
            share[d.fmt] = share.get(d.fmt, 0.0) + d.flops / total
        return share

    def projected_speedup(self, at_scale: bool = False) -> float:
        """GEMM time of the all-BF16 plan over this plan's, on the cost model's hardware; matmul-like ops
        left as traced count at BF16 speed on both sides. ``at_scale``: the same formats at the reference
        shapes and measured rates (matmul-like ops left as traced are not in it)."""
        if at_scale:
            mine = sum(d.ref_seconds for d in self.decisions)
            return sum(d.ref_bf16_seconds for d in self.decisions) / mine if mine else 1.0
        unplanned = sum(f for _, _, f in self.unplanned_ops if f is not None)
        rest = unplanned / (get_hardware(self.hardware).pflops("bf16") * 1e15)
        mine = sum(d.seconds for d in self.decisions) + rest
        return (sum(d.bf16_seconds for d in self.decisions) + rest) / mine if mine else 1.0

    def weight_bytes(self) -> tuple[float, float]:
        """Bytes of the weights as their fprop GEMMs read them, and the same in BF16."""
        fp = [d for d in self.decisions if d.role is MatmulRole.FPROP and d.weight_elems]
        return (sum(d.weight_elems * get_format(d.fmt).bits_per_value / 8 for d in fp),
                sum(d.weight_elems * 2.0 for d in fp))

    def summary(self) -> str:
        share = ", ".join(f"{fmt} {100 * s:.0f}%" for fmt, s in sorted(self.flop_share().items())) or "no GEMM planned"
        wq, wb = self.weight_bytes()
        lines = [f"FLOPs: {share}",
                 f"projected GEMM speedup vs BF16 on {self.hardware}: {self.projected_speedup():.2f}x"]
        if self.reference and any(d.ref_seconds for d in self.decisions):
            lines[-1] += f"; at scale: {self.projected_speedup(at_scale=True):.2f}x at {self.reference}"
        memory = f"weights {wq / 1e6:.3f} MB (BF16 {wb / 1e6:.3f} MB)"
        if self.saved_bytes:
            memory += f"; saved for backward {sum(self.saved_bytes.values()) / 1e6:.3f} MB"
        lines.append(memory)
        if self.not_compiled:
            lines.append(f"the shares cover compiled graphs only: {len(self.not_compiled)} modules ran eagerly "
                         f"(listed below), in their own dtype, and their FLOPs are not seen")
        if self.unplanned_ops:
            ops = ", ".join(sorted({op for _, op, _ in self.unplanned_ops}))
            text = (f"not planned: {len(self.unplanned_ops)} matmul-like ops autoprec does not rewrite ({ops}) "
                    f"run as traced, in their input dtype")
            if any(f is None for _, _, f in self.unplanned_ops):
                text += "; the FLOPs of some are unknown and not in the shares above"
            lines.append(text)
        return "\n".join(lines)

    def table(self, verbose: bool = False) -> str:
        """The decisions as a text table: short reasons in at most ``WIDTH`` columns, or (``verbose``) every
        column in full, with the measured scores (err, bias, loss-aware) and the whole reason."""
        if verbose:
            from rich.console import Console
            from rich.table import Table

            table = Table(*COLUMNS, box=None, pad_edge=False, header_style="bold")
            for row in self.rows():
                table.add_row(*row)
            console = Console(record=True, width=100_000, file=io.StringIO(), color_system=None)
            console.print(table)
            return "\n".join(line.rstrip() for line in console.export_text().splitlines())
        rows = self.short_rows()
        widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(SHORT_COLUMNS[:-1])]
        spare = WIDTH - sum(widths) - 2 * len(widths)
        if spare < MIN_REASON:  # long module paths give way, their ends kept
            widths[0] = max(len(SHORT_COLUMNS[0]), widths[0] - (MIN_REASON - spare))
            spare = WIDTH - sum(widths) - 2 * len(widths)
        lines = []
        for row in [SHORT_COLUMNS, *rows]:
            cells = [_fit(c, w, keep_end=i == 0).ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
            lines.append("  ".join([*cells, _fit(row[-1], max(spare, 1))]).rstrip())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render(verbose=False)

    def details(self) -> str:
        """The plan with every column and reason in full, and the passes' times (``print(plan.details())``)."""
        return self.render(verbose=True)

    def render(self, verbose: bool) -> str:
        """The table, then the summary and the notes: wrapped to ``WIDTH`` columns unless ``verbose``."""
        lines = [self.summary(), *self.schedule]
        if self.not_compiled:
            lines.append("ran outside autoprec (eagerly: after a graph break, in a skipped frame or outside the "
                         "compiled modules): " + ", ".join(self.not_compiled))
        lines += self.experts_lines()
        if self.unplanned_params:
            lines.append("parameters no planned GEMM reads: "
                         + ", ".join(f"{name} ({why})" for name, why in self.unplanned_params))
        lines += self.notes
        if verbose and self.pass_seconds:
            lines.append("pass times: " + ", ".join(f"{k} {v:.3f}s" for k, v in self.pass_seconds.items()))
        if not verbose:
            lines = [part for line in "\n".join(lines).splitlines()
                     for part in textwrap.wrap(line, WIDTH, subsequent_indent="  ", break_on_hyphens=False) or [""]]
            lines.append("(plan.details(): every reason in full, with the measured err / bias / loss scores)")
        return "\n".join([self.table(verbose), *lines])

    def to_json(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "hardware": self.hardware,
                "decisions": [d.to_json() for d in self.decisions]}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        where = str(path)
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"plan file {where}: cannot read it: {exc}") from exc
        return cls.from_json(data, f"plan file {where}")

    @classmethod
    def from_json(cls, data, where: str) -> "Plan":
        """A plan from its JSON form; ``where`` names the source in errors."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: the top level must be a JSON object with fields schema_version, "
                             f"hardware and decisions, got a {type(data).__name__}")
        if data.get("schema_version") not in READABLE_VERSIONS:
            raise ValueError(f"{where}: schema_version {data.get('schema_version')!r}, "
                             f"this autoprec reads {', '.join(map(str, READABLE_VERSIONS))}")
        if not isinstance(data.get("decisions"), list):
            raise ValueError(f"{where}: field 'decisions' must be a list of decisions, "
                             f"got {type(data.get('decisions')).__name__}")
        hardware = data.get("hardware", "gb300")
        if hardware not in HARDWARE:
            raise ValueError(f"{where}: field 'hardware' = {hardware!r} is not valid; "
                             f"valid: {', '.join(HARDWARE)}")
        decisions = [Decision.from_json(d, f"{where}, decision {i}") for i, d in enumerate(data["decisions"])]
        return cls(decisions=decisions, hardware=hardware)
