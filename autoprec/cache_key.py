"""Inductor's on-disk FX graph cache, keyed by autoprec's own code.

Inductor keys a cached graph by its code, inputs, settings and torch's version, not by the implementations of the
custom ops it calls: its compiled code asserts the shapes and strides the ops' fake implementations gave their
outputs, and calls them by name. A cache written by another version of autoprec could then run that version's
layouts against this one's ops. The inner compile therefore runs with torch's ``cache_key_tag`` (whatever the user
set, then a hash of autoprec's sources), which breaks the cache where autoprec changed.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Iterator
from pathlib import Path

import torch


@functools.cache
def source_hash() -> str:
    """sha256 (hex, 16 digits) of autoprec's Python sources: the package and its ``kernels`` and ``passes``."""
    import autoprec.kernels
    import autoprec.passes

    digest = hashlib.sha256()
    for package in (autoprec, autoprec.kernels, autoprec.passes):
        root = Path(package.__file__).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def keyed_by_autoprec() -> Iterator[None]:
    """Compiles inside key inductor's caches by ``source_hash()`` as well as by the user's ``cache_key_tag``."""
    user = torch.compiler.config.cache_key_tag
    with torch.compiler.config.patch(cache_key_tag=f"{user}|autoprec-{source_hash()}"):
        yield
