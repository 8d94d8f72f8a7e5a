"""Test session setup: without a GPU, Triton kernels run in the interpreter. Triton reads
TRITON_INTERPRET when it is first imported (torch.compile imports it too), so it is set here, first."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
