"""Calibration: run the partitioned graphs in high precision through an fx Interpreter and measure,
for every GEMM and candidate configuration, the error the rewrite would make.

Per GEMM and candidate: relative error ``|Ŷ-Y|²/|Y|²`` (noise), relative bias
``mean((Ŷ-Y)·sign(Y)) / mean|Y|`` (signed error against the signal), and for fprop GEMMs the
loss-aware score ``Σ(∂L/∂Y)²(Ŷ-Y)² / Σ(∂L/∂Y)²Y²``, with ∂L/∂Y taken from the gradient operand of the
same site's backward GEMMs when they run. Ŷ comes from the same quantize / scaled_mm calls the
rewritten graph makes, so what is measured is what will run.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx as fx
from rich.console import Console
from rich.progress import Progress

from autoprec.formats import get_format
from autoprec.kernels import dispatch
from autoprec.passes.candidates import Candidate, measured, operand_config
from autoprec.roles import MatmulRole

GemmKey = tuple[int, str, int]  # (site, role, ordinal within that site and role)
TAG = "autoprec_gemm"


@dataclass
class Stat:
    err: float
    bias: float
    loss: float | None = None


@dataclass
class GemmTag:
    """What calibration needs to know of a GEMM node (stored in ``node.meta[TAG]``)."""

    key: GemmKey
    grad_operand: int | None
    weight_operand: int | None
    seeds: tuple[int, int]


@dataclass
class Calibration:
    """Measurements of one compiled variant, filled while its calibration steps run."""

    mx_scale: str = "rceil"
    stats: dict[GemmKey, dict[Candidate, Stat]] = field(default_factory=dict)
    steps: int = 0
    _fwd_error: dict[int, tuple[torch.Tensor, dict[Candidate, torch.Tensor]]] = field(default_factory=dict)

    def emulate(self, a: torch.Tensor, b: torch.Tensor, bias, c: Candidate, tag: GemmTag) -> torch.Tensor:
        """The product the rewritten graph would compute under candidate ``c``, in fp32."""
        if c.fmt == "bf16":
            return dispatch.scaled_mm(a.bfloat16(), b.bfloat16(), bias)
        ops = []
        for which, x in enumerate((a, b)):
            axis, rounding, tile2d = operand_config(c, which, x.ndim, tag.grad_operand, tag.weight_operand)
            ops.append(dispatch.quantize(x, c.fmt, axis, rounding=rounding, seed=tag.seeds[which],
                                         tile2d=tile2d, scale_mode=self.mx_scale, rht=c.rht))
        return dispatch.scaled_mm(ops[0], ops[1], bias)

    def measure(self, tag: GemmTag, role: MatmulRole, a: torch.Tensor, b: torch.Tensor, bias) -> None:
        a32, b32 = a.detach().float(), b.detach().float()
        bias32 = None if bias is None else bias.detach().float()
        exact = torch.matmul(a32, b32) + (0 if bias32 is None else bias32)
        signal = exact.pow(2).sum().clamp_min(1e-30)
        mean_abs = exact.abs().mean().clamp_min(1e-30)
        has_weight = tag.weight_operand is not None
        site, errors = tag.key[0], {}
        out = self.stats.setdefault(tag.key, {})
        for c in measured(role, has_weight):
            if not _blockable(a32, b32, c):
                continue
            diff = self.emulate(a32, b32, bias32, c, tag) - exact
            out[c] = Stat(float(diff.pow(2).sum() / signal), float((diff * exact.sign()).mean() / mean_abs))
            errors[c] = diff
        if role is MatmulRole.FPROP:
            self._fwd_error[site] = (exact, errors)
        elif tag.grad_operand is not None and site in self._fwd_error:
            self._loss_scores(site, (a32, b32)[tag.grad_operand])

    def _loss_scores(self, site: int, grad: torch.Tensor) -> None:
        exact, errors = self._fwd_error[site]
        if grad.shape != exact.shape:
            grad = grad.transpose(-1, -2)
        if grad.shape != exact.shape:
            return
        g2 = grad.pow(2)
        denom = float((g2 * exact.pow(2)).sum().clamp_min(1e-30))
        stats = self.stats[(site, str(MatmulRole.FPROP), 0)]
        for c, diff in errors.items():
            stats[c].loss = float((g2 * diff.pow(2)).sum()) / denom
        del self._fwd_error[site]

    def end_step(self) -> None:
        self.steps += 1
        self._fwd_error.clear()


def _blockable(a: torch.Tensor, b: torch.Tensor, c: Candidate) -> bool:
    f = get_format(c.fmt)
    if not f.quantized:
        return True
    k = a.shape[-1]
    if k % f.block_size:
        return False
    return not c.tile2d or (b.ndim == 2 and b.shape[-1] % 16 == 0)


class CalibratingInterpreter(fx.Interpreter):
    """Runs a graph as is, measuring every tagged GEMM on its real operands."""

    def __init__(self, gm: fx.GraphModule, calibration: Calibration, last: bool) -> None:
        super().__init__(gm)
        self.calibration, self.last = calibration, last
        self.progress: Progress | None = None

    def run_node(self, n: fx.Node):
        result = super().run_node(n)
        tag = n.meta.get(TAG)
        if tag is not None and n.op == "call_function":  # saved forward values keep the meta as placeholders
            args = [self.env[a] if isinstance(a, fx.Node) else a for a in n.args]
            bias, a, b = (args[0], args[1], args[2]) if len(args) == 3 else (None, args[0], args[1])
            with torch.no_grad():
                self.calibration.measure(tag, MatmulRole(tag.key[1]), a, b, bias)
            self.progress.advance(self.progress.task_ids[0])
        return result

    def run(self, *args, **kwargs):
        tagged = sum(1 for n in self.graph.nodes if n.op == "call_function" and TAG in n.meta)
        console = Console(stderr=True)
        with Progress(console=console, transient=True, disable=not console.is_terminal) as self.progress:
            self.progress.add_task("autoprec: calibrating GEMMs", total=tagged)
            out = super().run(*args, **kwargs)
        if self.last:
            self.calibration.end_step()
        return out
