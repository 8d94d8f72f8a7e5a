"""Reference emulated quantized matmul: quantize each operand along the reduction axis, multiply in fp32."""
from __future__ import annotations

import torch

from autoprec.formats import Format, get_format

from .hadamard import rht_ref
from .quantize import fake_quantize_ref


def qmm_ref(
    a: torch.Tensor,
    b: torch.Tensor,
    fmt_a: str | Format,
    fmt_b: str | Format,
    *,
    rounding_a: str = "rne",
    rounding_b: str = "rne",
    tile2d_b: bool = False,
    rht: bool = False,
    rht_signs: torch.Tensor | None = None,
    seed: int = 0,
    scale_mode: str = "rceil",
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``a @ b`` for ``a`` (..., M, K) and ``b`` (..., K, N) with both operands blocked along K.

    ``rht`` applies the random Hadamard transform along K to both operands first (the wgrad
    recipe). ``tile2d_b`` gives ``b`` square tiles (a weight: NVFP4's 16x16, FP8-block's 128x128). SR draws
    operand a's bits from ``seed`` and b's from ``seed + 1``.
    """
    fmt_a, fmt_b = get_format(fmt_a), get_format(fmt_b)
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"qmm: shapes {tuple(a.shape)} @ {tuple(b.shape)} do not multiply")
    if rht:
        a, b = rht_ref(a, -1, rht_signs), rht_ref(b, -2, rht_signs)
    qa = fake_quantize_ref(a, fmt_a, -1, **_opts(fmt_a, rounding_a, seed, scale_mode, False))
    qb = fake_quantize_ref(b, fmt_b, -2, **_opts(fmt_b, rounding_b, seed + 1, scale_mode, tile2d_b))
    return torch.matmul(qa, qb).to(out_dtype)


def _opts(fmt: Format, rounding: str, seed: int, scale_mode: str, tile2d: bool) -> dict:
    if not fmt.quantized:
        return {}
    opts: dict = {"rounding": rounding, "seed": seed}
    if fmt.tile:
        opts["tile2d"] = tile2d
    else:
        opts["scale_mode"] = scale_mode
    return opts
