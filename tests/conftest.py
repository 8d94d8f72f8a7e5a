"""Test session setup: without a GPU, Triton kernels run in the interpreter. Triton reads
TRITON_INTERPRET when it is first imported (torch.compile imports it too), so it is set here, first."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def fresh_dynamo():
    """A clean dynamo cache and plan registry around a compiler test."""
    from autoprec.model_plan import STATES

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # graph-break reasons the plan reports
    STATES.clear()
    yield
    torch._dynamo.reset()
