"""Runs passes, timing each, and names the failing pass and node when one raises."""
from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch.fx as fx

_CURRENT_NODE: contextvars.ContextVar[fx.Node | None] = contextvars.ContextVar("autoprec_node", default=None)


class PassError(RuntimeError):
    """A pass failed; the message names the pass and the graph node it was working on."""


@contextmanager
def at_node(node: fx.Node) -> Iterator[None]:
    """Mark the node a pass is working on, for error messages."""
    token = _CURRENT_NODE.set(node)
    try:
        yield
    finally:
        _CURRENT_NODE.reset(token)


class PassRunner:
    """Calls passes in order and keeps ``timings`` (seconds per pass name)."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    def run(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        _CURRENT_NODE.set(None)
        try:
            return fn(*args, **kwargs)
        except PassError:
            raise
        except Exception as exc:
            node = _CURRENT_NODE.get()
            where = f" at node {node.name} ({node.target})" if node is not None else ""
            if type(exc) in (ValueError, TypeError):  # bad user input: keep its type for the caller
                raise type(exc)(f"autoprec pass {name!r}{where}: {exc}") from exc
            raise PassError(f"autoprec pass {name!r} failed{where}: {type(exc).__name__}: {exc}") from exc
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start
