"""Inductor's FX graph cache keyed by autoprec's sources (``autoprec/cache_key.py``)."""
import uuid

import pytest
import torch

from autoprec import cache_key
from autoprec.inner_compiles import _COMPILED

from gpt_model import MLP

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def inductor_cache_counts() -> tuple[int, int]:
    """(FX graph cache hits, misses) of compiling and running an MLP's mxfp8 step under inductor anew."""
    torch._dynamo.reset()
    _COMPILED.clear()  # autoprec's in-process reuse of inner compiles would skip inductor's cache
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    m = MLP()
    c = torch.compile(m, backend="autoprec", options={"recipe": "mxfp8", "inner": "inductor"})
    c(torch.randn(2, 16, 32)).sum().backward()
    counts = torch._dynamo.utils.counters["inductor"]
    return counts["fxgraph_cache_hit"], counts["fxgraph_cache_miss"]


def test_inductor_cache_is_keyed_by_autoprec_sources(monkeypatch):
    """A graph cached by this autoprec is reused; one cached by an autoprec of other sources (other op
    implementations, whose output layouts the compiled code asserts) is not."""
    # a user's tag of this run's own: the cache holds nothing under it yet (the key keeps the user's tag too)
    monkeypatch.setattr(torch.compiler.config, "cache_key_tag", f"test-{uuid.uuid4()}")
    with torch._inductor.config.patch(fx_graph_cache=True):
        assert inductor_cache_counts() == (0, 2)  # forward and backward
        assert inductor_cache_counts() == (2, 0)
        digest = cache_key.source_hash()
        assert len(digest) == 16 and digest == cache_key.source_hash.__wrapped__()  # read anew: the same sources
        monkeypatch.setattr(cache_key, "source_hash", lambda: "another autoprec")
        assert inductor_cache_counts() == (0, 2)
