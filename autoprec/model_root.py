"""Which model a compiled graph belongs to, and the names of its modules.

The backend finds the model (its root module) from the parameters a graph receives: the outermost compiled
module that holds them; under regional compilation (several compiled modules of one tree, none inside another,
as torchtitan compiles each block), the model they are part of; for a compiled function or method, the top of
the module tree that holds them. Module names are the ones users write: wrapper modules (torch.compile's
``_orig_mod``, activation checkpointing's ``_checkpoint_wrapped_module``, FSDP1's) are not part of them.
"""
from __future__ import annotations

import gc
import re
import weakref

import torch
from torch._dynamo.eval_frame import OptimizedModule

_KNOWN_ROOTS: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
_SOURCE_PART = re.compile(r"\.(?:_modules|_parameters|_buffers|__dict__\['_modules'\])\['([^']+)'\]|\.([A-Za-z_]\w*)")
_DICT_MODULE = re.compile(r"(?:^|\.)__dict__\['_modules'\]\['([^']+)'\]")
# modules that wrap one module and add no name of their own (torch strips them from state dicts, or users
# never see them): torch.compile's, activation checkpointing's, FSDP1's
_WRAPPERS = frozenset({"_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module"})


def _live_modules() -> list[torch.nn.Module]:
    # type(), not isinstance: isinstance would touch weak proxies and deprecated module stand-ins
    return [obj for obj in gc.get_objects() if issubclass(type(obj), torch.nn.Module)]


def _compiled_roots(modules: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """Modules handed to torch.compile (``torch.compile(m)`` or ``m.compile()``) that are alive now."""
    _KNOWN_ROOTS.update(c for c in map(_compiled, modules) if c is not None)
    return list(_KNOWN_ROOTS)


def _compiled(m: torch.nn.Module) -> torch.nn.Module | None:
    """The module ``m`` compiles: the one it wraps (``torch.compile(m)``), itself (``m.compile()``), or None."""
    if isinstance(m, OptimizedModule):
        return m._orig_mod
    return m if m.__dict__.get("_compiled_call_impl") is not None else None


def compiled_regions(root: torch.nn.Module) -> list[str]:
    """Names of the compiled modules inside ``root``, ``root`` excluded (regional compilation)."""
    return list(dict.fromkeys(module_name(n) for n, m in root.named_modules()
                              if _compiled(m) is not None and _compiled(m) is not root))


def holds(outer: torch.nn.Module, inner: torch.nn.Module) -> bool:
    """Whether ``inner`` is ``outer`` or one of its submodules."""
    return any(m is inner for m in outer.modules())


def _parents(modules: list[torch.nn.Module]) -> dict[int, torch.nn.Module]:
    """id(child) -> its parent, over the live module trees."""
    return {id(c): m for m in modules for c in m._modules.values() if c is not None}


def _ancestors(parent: dict[int, torch.nn.Module], module: torch.nn.Module) -> list[torch.nn.Module]:
    """``module``'s parent, its parent's parent, ... up to the top of its tree."""
    out = []
    while id(module) in parent:
        module = parent[id(module)]
        out.append(module)
    return out


def _outermost_owner(modules: list[torch.nn.Module], ids: set[int]) -> torch.nn.Module | None:
    """The top of the module tree that holds one of the parameters ``ids`` (for a compiled function or
    bound method, e.g. ``torch.compile(model.forward)``, whose module was not itself compiled)."""
    owner = next((m for m in modules if any(id(p) in ids for p in m._parameters.values())), None)
    return ([owner] + _ancestors(_parents(modules), owner))[-1] if owner is not None else None


def _regional_model(modules: list[torch.nn.Module], compiled: list[torch.nn.Module],
                    region: torch.nn.Module) -> torch.nn.Module:
    """The model a compiled module belongs to: under regional compilation (several compiled modules of one
    tree, none inside another: torchtitan compiles each block), the top of the tree (with DDP, the DDP module,
    as when DDP is compiled whole); otherwise the compiled module itself."""
    above = _ancestors(_parents(modules), region)
    if not above:
        return region
    tree = {id(m) for m in above[-1].modules()}
    inside = {id(m) for m in region.modules()} | {id(m) for m in above}
    return above[-1] if any(id(c) in tree and id(c) not in inside for c in compiled) else region


def named_parameters(root: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """``root.named_parameters`` with duplicates (tied weights), named without wrappers (``module_name``: a
    compiled block inside the model, ``layers.0._orig_mod.attn.weight``, is ``layers.0.attn.weight``)."""
    return [(module_name(n), p) for n, p in root.named_parameters(remove_duplicate=False)]


def named_modules(root: torch.nn.Module, remove_duplicate: bool = False) -> list[tuple[str, torch.nn.Module]]:
    """``root.named_modules``, named as ``named_parameters`` names them (a compiled block once: the
    OptimizedModule and the block it wraps share a name; other wrappers share their module's name too)."""
    named = [(module_name(n), m) for n, m in root.named_modules(remove_duplicate=remove_duplicate)]
    return [(n, m) for n, m in named if not isinstance(m, OptimizedModule)]


def module_name(path: str) -> str:
    """A module path as users name it: without wrapper modules (``blocks.0._checkpoint_wrapped_module.attn``
    and dynamo's ``blocks.0.__dict__['_modules']['_checkpoint_wrapped_module'].attn`` are ``blocks.0.attn``)."""
    path = _DICT_MODULE.sub(r".\1", path)
    return ".".join(part for part in path.split(".") if part and part not in _WRAPPERS)


def find_root(params: list[torch.nn.Parameter]) -> torch.nn.Module | None:
    """The model of ``params``: the outermost compiled module holding them (under regional compilation, the
    model it is part of); failing that, the top of the module tree that holds them; None for parameters
    that belong to no module."""
    if not params:
        return None
    ids = {id(p) for p in params}

    def holders(roots):  # ids only: names (and their unwrapping) are not needed to tell who holds a parameter
        return [r for r in roots if any(id(p) in ids for p in r.parameters())]

    def largest(found):
        return max(found, key=lambda r: sum(1 for _ in r.modules()))

    found = holders(list(_KNOWN_ROOTS))
    if found:
        return largest(found)
    modules = _live_modules()
    compiled = _compiled_roots(modules)
    found = holders(compiled)
    root = _regional_model(modules, compiled, largest(found)) if found else _outermost_owner(modules, ids)
    if root is not None:
        _KNOWN_ROOTS.add(root)
    return root


def source_path(source: str) -> str | None:
    """``L['self']._modules['attn']._parameters['weight']`` -> ``attn.weight`` (None if not of that form)."""
    head = re.match(r"^[LG]\['[^']+'\]", source)
    if head is None:
        return None
    rest, parts = source[head.end():], []
    while rest:
        m = _SOURCE_PART.match(rest)
        if m is None:
            return None
        parts.append(m.group(1) or m.group(2))
        rest = rest[m.end():]
    return module_name(".".join(parts))


def frame_prefix(aliases: dict[int, list[str]], params: list[tuple[str | None, object]]) -> str | None:
    """The root-relative name of a graph's frame module (``blocks.1.`` for a Block frame, ``""`` for the
    root's), from (source, real parameter) pairs: a root name of the parameter (``aliases``: id -> its
    names in the root, several for tied weights) minus its frame-relative path."""
    for source, p in params:
        rel = source_path(source) if source else None
        for full in aliases.get(id(p), ()) if rel else ():
            if full.endswith(rel) and (len(full) == len(rel) or full[-len(rel) - 1] == "."):
                return full[: len(full) - len(rel)]
    return None
