"""The Triton kernels stay compilable by Triton releases older than the floor's 3.6 too (3.4 is torch 2.8's): Triton
3.4 hashes a jit function's callees without remembering those it is already hashing, so a jit function reaching
itself through its calls (``join_slices`` once joined its halves by calling itself) made every kernel using it fail
with a RecursionError before compiling. Triton 3.5 on, the tests' 3.9 too, do not fail there, so the call graph is
checked here instead."""
from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap

import pytest

pytest.importorskip("triton")
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

import autoprec.kernels as kernels  # noqa: E402

JIT = (JITFunction, InterpretedFunction)  # what triton.jit makes, compiling or (TRITON_INTERPRET, the tests') not


def jit_functions() -> dict[str, JITFunction | InterpretedFunction]:
    """Every jit function defined in autoprec.kernels, by module-qualified name (autotuned kernels unwrapped)."""
    found = {}
    for info in pkgutil.walk_packages(kernels.__path__, prefix="autoprec.kernels."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            fn = value
            while not isinstance(fn, JIT) and hasattr(fn, "fn"):
                fn = fn.fn
            if isinstance(fn, JIT) and fn.fn.__module__ == module.__name__:
                found[f"{module.__name__}.{fn.fn.__name__}"] = fn
    return found


def callees(fn: JITFunction | InterpretedFunction, by_object: dict[int, str]) -> set[str]:
    """The jit functions ``fn``'s body names: globals of its module, or attributes of them (``qc.slices_tile``)."""
    scope = fn.fn.__globals__
    found = []
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))):
        if isinstance(node, ast.Name) and node.id in scope:
            found.append(scope[node.id])
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in scope:
            found.append(getattr(scope[node.value.id], node.attr, None))
    return {by_object[id(value)] for value in found if id(value) in by_object}


def test_no_triton_jit_function_reaches_itself():
    functions = jit_functions()
    assert len(functions) > 50 and any(name.endswith(".join_slices") for name in functions)
    by_object = {id(fn): name for name, fn in functions.items()}
    graph = {name: callees(fn, by_object) for name, fn in functions.items()}
    assert "autoprec.kernels.triton.slices.join_slices" in graph["autoprec.kernels.triton.quantize_rows._load_tile"]
    assert "autoprec.kernels.triton.quantize_cols.nvfp4_store_slices" in graph[  # through the module's name
        "autoprec.kernels.triton.quantize_k_groups._nvfp4_k_groups_cols_kernel"]

    def reaches(start: str) -> bool:
        seen, todo = set(), list(graph[start])
        while todo:
            name = todo.pop()
            if name == start:
                return True
            if name not in seen:
                seen.add(name)
                todo.extend(graph[name])
        return False

    assert [name for name in graph if reaches(name)] == []
