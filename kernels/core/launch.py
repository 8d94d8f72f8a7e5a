"""Host-side arithmetic of the Triton launches (grids), kept in plain Python: ``triton.cdiv`` is a constexpr
function in Triton 3.9, whose argument unwrapping costs about 2 us per host call, several per launch; and whether
the launches run in Triton's interpreter, and which of the GPU's format conversions the kernels may take."""
from __future__ import annotations

import functools
import math
import os

import torch

# the first GPUs whose PTX rounds fp32 to E4M3 / E5M2 (Ada, sm_89), and to E2M1 (Blackwell, sm_100), in one
# instruction (cvt.rn.satfinite)
FP8_CONVERSIONS, FP4_CONVERSIONS = (8, 9), (10, 0)


def cdiv(a: int, b: int) -> int:
    """``a / b`` rounded up, for positive ``b``."""
    return -(-a // b)


# Whether Triton's kernels run in its interpreter (``TRITON_INTERPRET=1``) rather than on a GPU: read at the first
# launch and kept. Triton reads the variable when it decorates a kernel, at the import of the module defining it,
# which the first op imports; and a read of os.environ costs about 0.8 us of host time, several per op call.
INTERPRET: bool | None = None


def interpreting() -> bool:
    """Whether Triton's kernels run in its interpreter rather than on a GPU (``INTERPRET``)."""
    global INTERPRET
    if INTERPRET is None:
        INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
    return INTERPRET


def hardware_fp8(device: torch.device) -> bool:
    """Whether the MXFP8 kernels launched on ``device`` round to nearest with the GPU's fp8 conversion
    (``numerics.round_and_encode_fp8``): a CUDA GPU from sm_89 on, never in the interpreter."""
    return _converts(device, FP8_CONVERSIONS)


def hardware_fp4(device: torch.device) -> bool:
    """Whether the NVFP4 kernels launched on ``device`` round to nearest with the GPU's E2M1 conversion
    (``numerics.e2m1_pair``): a CUDA GPU from sm_100 on, never in the interpreter."""
    return _converts(device, FP4_CONVERSIONS)


def nvfp4_hardware(device: torch.device) -> int:
    """The NVFP4 quantizers' HW level on ``device``: 2 where they round their elements (``e2m1_pair``) and block
    scales (``nvfp4_block_scales``) with the GPU's conversions (sm_100 on), 1 the block scales alone (E4M3: sm_89
    on), 0 neither (other devices, and the interpreter)."""
    return hardware_fp8(device) + hardware_fp4(device)


def guarded_grid(grid: tuple[int, ...], flag: torch.Tensor | None, device: torch.device) -> tuple[int, ...]:
    """A kernel's ``grid``, or for its guarded fp32 recompute (``flag`` given) the persistent 1D grid striding over
    those programs' tiles: at most four programs per SM on a GPU (the recompute, when the device flag is set, still
    fills it), four in the interpreter."""
    if flag is None:
        return grid
    return (min(math.prod(grid), 4 * _sm_count(device.index) if device.type == "cuda" else 4),)


def _converts(device: torch.device, since: tuple[int, int]) -> bool:
    return not interpreting() and device.type == "cuda" and _capability(device.index) >= since


@functools.lru_cache(maxsize=None)
def _capability(index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@functools.lru_cache(maxsize=None)
def _sm_count(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
