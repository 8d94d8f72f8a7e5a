"""Calibration run: the graph as traced through an fx Interpreter, every GEMM the pipeline tagged measured on its
real operands by the planner's ``Calibration`` (``autoprec.planner.calibration``). See docs/planner.md."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx
from rich.console import Console
from rich.progress import Progress

from autoprec.planner.calibration import Calibration
from autoprec.roles import MatmulRole

TAG = "autoprec_gemm"  # node meta key of a GEMM to measure: its ``GemmTag``


class CalibratingInterpreter(fx.Interpreter):
    """Runs a graph as is, measuring every tagged GEMM on its real operands."""

    def __init__(self, gm: fx.GraphModule, calibration: Calibration, on_end: Callable[[], None] | None) -> None:
        super().__init__(gm)
        self.calibration, self.on_end = calibration, on_end
        self.progress: Progress | None = None

    def run_node(self, n: fx.Node):
        result = super().run_node(n)
        tag = n.meta.get(TAG)
        if tag is not None and n.op == "call_function":  # saved forward values keep the meta as placeholders
            args = [self.env[a] if isinstance(a, fx.Node) else a for a in n.args]
            with torch.no_grad():
                if tag.layout is not None:  # aten._grouped_mm (offs may be a keyword) or autoprec.grouped_mm
                    offs = args[2] if len(args) > 2 else n.kwargs.get("offs")
                    offs = self.env[offs] if isinstance(offs, fx.Node) else offs
                    self.calibration.measure(tag, MatmulRole(tag.key[1]), args[0], args[1], None, offs)
                else:
                    bias, a, b = (args[0], args[1], args[2]) if len(args) == 3 else (None, args[0], args[1])
                    self.calibration.measure(tag, MatmulRole(tag.key[1]), a, b, bias, product=result)
            self.progress.advance(self.progress.task_ids[0])
        return result

    def run(self, *args, **kwargs):
        tagged = sum(1 for n in self.graph.nodes if n.op == "call_function" and TAG in n.meta)
        console = Console(stderr=True)
        with Progress(console=console, transient=True, disable=not console.is_terminal) as self.progress:
            self.progress.add_task("autoprec: calibrating GEMMs", total=tagged)
            out = super().run(*args, **kwargs)
        if self.on_end is not None:
            self.on_end()
        return out
