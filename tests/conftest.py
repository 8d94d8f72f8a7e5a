"""Test session setup: without a GPU, Triton kernels run in the interpreter. Triton reads
TRITON_INTERPRET when it is first imported (torch.compile imports it too), so it is set here, first."""
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
import torch
import torch._functorch.config as functorch_config

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _minor(package: str) -> tuple[int, ...]:
    """(major, minor) of an installed package; (0, 0) where it is not installed."""
    try:
        return tuple(int(part) for part in version(package).split(".")[:2])
    except PackageNotFoundError:
        return (0, 0)


# Triton's interpreter before 3.7 takes an int of a 1-element array (a program id bounding a loop), which numpy 2.4
# refuses: stop with the fix rather than fail every interpreted kernel with a persistent loop
if os.environ.get("TRITON_INTERPRET") == "1" and (0, 0) < _minor("triton") < (3, 7) and _minor("numpy") >= (2, 4):
    pytest.exit(f"Triton {version('triton')}'s interpreter, which runs the kernels in these tests without a GPU, fails "
                f"under numpy {version('numpy')}: pip install 'numpy<2.4' (scripts/setup.sh does), or Triton 3.7 or "
                "later", returncode=4)

# `python -m pytest` puts the working directory, the repository root, first on sys.path. There the kernels/
# folder would pass for Hugging Face's `kernels` package, which transformers (5.25+) probes for and then
# imports from. autoprec is installed, so the tests do not need the root on the path.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]

# A custom op whose outputs alias its inputs or each other is an error in compiled graphs (torch warns, for now)
functorch_config.error_on_custom_op_aliasing = True


@pytest.fixture
def fresh_dynamo():
    """A clean dynamo cache, plan registry and cache of inner compiles around a compiler test."""
    from autoprec.inner_compiles import _COMPILED
    from autoprec.planner.model_planner import PLANNERS

    _COMPILED.clear()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # graph-break reasons the plan reports
    PLANNERS.clear()
    yield
    torch._dynamo.reset()


@pytest.fixture
def inner_compiles(monkeypatch) -> list[str]:
    """The code of every graph the inner compiler compiled during the test."""
    from autoprec import inner_compiles

    codes, once = [], inner_compiles.compile_once

    def counting(compiler, settings):
        def compile_graph(g, example_inputs):
            codes.append(g.code)
            return compiler(g, example_inputs)

        return once(compile_graph, settings)

    monkeypatch.setattr(inner_compiles, "compile_once", counting)
    return codes
