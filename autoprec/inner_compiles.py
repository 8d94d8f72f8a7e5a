"""The inner compiles of one dynamo graph's variants, shared where their rewritten graphs are the same.

A dynamo graph run by several module instances (identical blocks after a graph break, or each block compiled
on its own) is planned and rewritten per instance (backend.py's variants). Blocks with the same decisions
rewrite to the same code (their SR seeds are offset by the block's ``path_key``, which the step input carries),
so the inner compiler, inductor's and by far the costly part, need run once for all of them.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.fx as fx


class InnerCompiles:
    """Compiled graphs by (code, example inputs), each kept while some variant's compiled function holds it."""

    def __init__(self) -> None:
        # each with the output strides the compile reported (inductor's layout of the forward's outputs)
        self.compiled: dict[tuple, tuple[weakref.ref, list | None]] = {}

    def once(self, compiler: Callable) -> Callable:
        """``compiler`` run once per distinct graph: a graph that is the same code on the same example inputs as
        one compiled before runs that compiled function, and reports the output strides its compile reported
        (AOTAutograd lays the backward's saved inputs out by them)."""
        def compile_or_reuse(g: fx.GraphModule, example_inputs):
            key = (g.code, tuple(_input_meta(x) for x in example_inputs))
            context = torch._guards.TracingContext.try_get()
            reported = None if context is None else context.output_strides
            ref, strides = self.compiled.get(key, (lambda: None, None))
            fn = ref()
            if fn is None:
                start = 0 if reported is None else len(reported)
                fn = compiler(g, example_inputs)
                self.compiled = {k: v for k, v in self.compiled.items() if v[0]() is not None}
                self.compiled[key] = (weakref.ref(fn), None if reported is None else reported[start:])
            elif reported is not None and strides:
                reported.extend(strides)
            return fn

        return compile_or_reuse


def _input_meta(x) -> tuple | str:
    """What a compiled graph's example input fixes: a tensor's shape, strides, dtype and device, else its value."""
    if isinstance(x, torch.Tensor):
        return str(tuple(x.shape)), str(x.stride()), x.dtype, x.device, x.requires_grad
    return repr(x)
