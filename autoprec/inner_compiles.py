"""Inner compiles shared by graphs that rewrite to the same code.

A dynamo graph run by several module instances (identical blocks after a graph break, or each block compiled
on its own) is planned and rewritten per instance (backend.py's variants), and a model whose blocks guard on
their index (a KV cache's layer, say) gives each block a dynamo graph of its own. Blocks with the same
decisions rewrite to the same code (their SR seeds are offset by the block's ``path_key``, which the step
input carries), so the inner compiler, inductor's and by far the costly part, need run once for all of them:
as inductor's own graph cache does across processes, a graph is reused by its code, its constants' values,
its example inputs and the compiler's settings.
"""
from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable

import torch
import torch.fx as fx
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from autoprec.cache_key import keyed_by_autoprec

# compiled graphs by key, each with the output strides its compile reported (inductor's layout of a forward's
# outputs), kept while some compiled model holds the compiled function
_COMPILED: dict[tuple, tuple[weakref.ref, list | None]] = {}


def compile_once(compiler: Callable, settings: tuple) -> Callable:
    """``compiler`` (whose behaviour ``settings`` fixes) run once per distinct graph: a graph that is the same code
    on the same constants and example inputs as one compiled before runs that compiled function, and reports the
    output strides its compile reported (AOTAutograd lays the backward's saved inputs out by them)."""
    def compile_or_reuse(g: fx.GraphModule, example_inputs):
        context = torch._guards.TracingContext.try_get()
        # symbolic sizes: compiled under the facts its shape environment holds, so shared only within it
        shapes = id(context.fake_mode.shape_env) if context and context.fake_mode and any(
            _symbolic(x) for x in example_inputs) else None
        key = (settings, shapes, g.code, _constants(g), tuple(_input_meta(x) for x in example_inputs))
        reported = None if context is None else context.output_strides
        ref, strides = _COMPILED.get(key, (lambda: None, None))
        fn = ref()
        if fn is None:
            start = 0 if reported is None else len(reported)
            fn = compiler(g, example_inputs)
            for dead in [k for k, (r, _) in _COMPILED.items() if r() is None]:
                del _COMPILED[dead]
            _COMPILED[key] = (weakref.ref(fn), None if reported is None else reported[start:])
        elif reported is not None and strides:
            reported.extend(strides)
        return fn

    return compile_or_reuse


def _constants(g: fx.GraphModule) -> tuple:
    """The graph's attributes (lifted constants, subgraphs) by value: two graphs of one code may hold different
    ones; one that cannot be read by value (a fake tensor, another object) by identity, which no other graph
    shares."""
    out = []
    for node in g.graph.find_nodes(op="get_attr"):
        value = g
        for part in node.target.split("."):
            value = getattr(value, part)
        if isinstance(value, fx.GraphModule):
            out.append((node.target, value.code, _constants(value)))
        elif isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor) and value.layout == torch.strided:
            with unset_fake_temporarily():  # compiles run under the graph's fake mode; the constant is real
                data = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            out.append((node.target, _input_meta(value), hashlib.sha1(data).hexdigest()))
        else:
            out.append((node.target, id(value)))
    return tuple(out)


def _symbolic(x) -> bool:
    """Whether an example input has a symbolic value, size or stride."""
    if isinstance(x, torch.Tensor):
        return any(isinstance(v, torch.SymInt) for v in (*x.shape, *x.stride()))
    return isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _input_meta(x) -> tuple | str:
    """What a compiled graph's example input fixes: a tensor's shape, strides, dtype and device, else its value."""
    if isinstance(x, torch.Tensor):
        return str(tuple(x.shape)), str(x.stride()), x.dtype, x.device, x.requires_grad
    return repr(x)


def decompositions(inner: str) -> dict | None:
    """The decompositions AOTAutograd traces with: inductor's table for inductor, none for aot_eager."""
    if inner != "inductor":
        return None
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def inner_compiler(inner: str, mode: str | None) -> Callable:
    """The compiler of a rewritten graph (``inner`` option: aot_eager's boxed GraphModule, or inductor in
    torch.compile's ``mode``), run once per distinct graph (``compile_once``)."""
    if inner != "inductor":
        return compile_once(lambda g, example_inputs: make_boxed_func(g), ("aot_eager",))
    from torch._inductor import config, list_mode_options
    from torch._inductor.compile_fx import compile_fx_inner

    patches = {} if mode is None else list_mode_options(mode)

    def compile_in_mode(g: fx.GraphModule, example_inputs):
        with config.patch(patches), keyed_by_autoprec():
            return compile_fx_inner(g, example_inputs)

    return compile_once(compile_in_mode, ("inductor", mode, config.get_hash()))
