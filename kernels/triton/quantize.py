"""The Triton quantizer's entry: a tensor along one axis to NVFP4 or MXFP8 codes and scales, rows through the tile
kernels of ``quantize_rows``, blocks read down a strided dim (a column copy) through the slice kernels of
``quantize_cols``. See docs/kernels.md."""
from __future__ import annotations

import torch

from autoprec.formats import NVFP4, Format

from ..core.quantized import QuantizedTensor, normalize_axis
from ..core.random_bits import StepStream, sr_bits
from . import quantize_cols as cols
from .quantize_rows import as_matrix, hashed_stream, index_strides, kernel_keys, quantize_rows, rht_operand


def quantize_triton(
    x: torch.Tensor,
    fmt: Format,
    axis: int = -1,
    *,
    rand: torch.Tensor | None = None,
    seed: int | StepStream | None = None,
    tile2d: bool = False,
    scale_mode: str = "rceil",
    rht: bool = False,
    rht_signs_: torch.Tensor | None = None,
    amax: torch.Tensor | None = None,
) -> QuantizedTensor:
    """Triton quantize of ``x`` (already checked by ``supports``) along ``axis``; the RHT, if asked,
    is applied along ``axis`` inside the kernel. Stochastic rounding takes its bits from ``rand`` or,
    given the stream ``seed`` instead (an int, or a ``StepStream`` whose step the kernel reads on the device),
    computes ``sr_bits(x.shape, seed)`` in the kernel (no pass over memory; a 3D tensor blocked along its
    middle dim materialises them). ``amax``: NVFP4's tensor amax cell of the values this quantization encodes (with
    the RHT, of their transform along ``axis``), already computed with the other copy's of a pair
    (``quantize_cols.pair_amax``), so no amax pass runs."""
    if amax is not None and fmt is not NVFP4:
        raise ValueError(f"quantize_triton: a given amax is NVFP4's tensor amax, got {fmt.name}")
    axis = normalize_axis(axis, x.ndim)
    m = as_matrix(x, axis)
    n_rows, k = m.shape
    hashed = seed is not None and rand is None and (index := index_strides(x.shape, axis)) is not None
    keys = kernel_keys(seed if hashed else None)
    if hashed:  # rand_ptr: unused, or the step of a StepStream
        hash_mode, r_m = hashed_stream(seed, m)
        r_strides = index
    else:
        if seed is not None and rand is None:
            rand = sr_bits(x.shape, int(seed), x.device)
        hash_mode, r_m = 0, as_matrix(rand, axis) if rand is not None else m
        r_strides = r_m.stride()
    mt = rht_operand(x, rht, rht_signs_)
    stored = x.shape[:axis] + x.shape[axis + 1:] + (k,)
    scale_shape = (n_rows // 16, k // 16) if tile2d else stored[:-1] + (k // fmt.block_size,)
    codes = torch.empty(stored[:-1] + (k // 2 if fmt is NVFP4 else k,), device=x.device, dtype=torch.uint8)
    scales = torch.empty(scale_shape, device=x.device, dtype=torch.uint8)
    s_dec = torch.empty((), device=x.device, dtype=torch.float32) if fmt is NVFP4 else None
    common = dict(RHT=rht, SR=rand is not None or hashed, HASH=hash_mode)
    args = (m, mt, r_m, *keys, codes, scales)
    if m.stride(1) != 1 and not tile2d:  # blocks read down a strided dim (a column copy), not in 16x16 tiles
        cols.quantize_cols(fmt, args, s_dec, r_strides, scale_mode, common, amax)
    else:
        quantize_rows(fmt, args, s_dec, r_strides, scale_mode, common, amax, tile2d)
    if fmt is NVFP4:
        return QuantizedTensor(NVFP4, codes, scales.view(torch.float8_e4m3fn), s_dec, axis, x.shape,
                               16 if tile2d else 1)
    return QuantizedTensor(fmt, codes.view(fmt.elem.torch_dtype), scales, None, axis, x.shape)
