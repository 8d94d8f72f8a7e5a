"""The quantized tensor: real codes + block scales (+ tensor scale), with the block axis recorded."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from autoprec.formats import Format

from .mode import kernel_mode
from .random_bits import StepStream


@dataclass(frozen=True)
class QuantizedTensor:
    """A block-quantized tensor.

    Storage keeps the block axis last: ``codes`` and ``scales`` are laid out for
    ``x.movedim(axis, -1)``. NVFP4 codes are uint8 with two E2M1 codes per byte (even index in the
    low nibble) and ``scales`` are float8_e4m3fn with an fp32 ``tensor_scale`` (S_dec); MXFP8 codes
    are float8 and ``scales`` are uint8 E8M0 codes; FP8-block codes are float8_e4m3fn and ``scales`` fp32 decode
    factors. ``tile_rows`` is the tile side for square weight tiles (16 for NVFP4, 128 for FP8-block; one scale
    per tile; storage must then be 2D) and 1 for ordinary 1-D blocks.
    """

    fmt: Format
    codes: torch.Tensor
    scales: torch.Tensor
    tensor_scale: torch.Tensor | None
    axis: int
    shape: torch.Size
    tile_rows: int = 1

    @property
    def nbytes(self) -> int:
        """Bytes actually held: codes, scales and tensor scale."""
        total = self.codes.nbytes + self.scales.nbytes
        return total + (self.tensor_scale.nbytes if self.tensor_scale is not None else 0)


@dataclass(frozen=True)
class QuantizedGroups:
    """A grouped GEMM operand whose groups are quantized each on its own, stored together: token groups (``shape``
    (T, K), blocked along K, group g the rows between its cumulative ends; codes and scales laid out as the whole
    tensor's ``QuantizedTensor``) or batch items (``shape`` (E, K, N), item e blocked along K; codes (E, N, ...),
    scales (E, ...), each item laid out as its own ``QuantizedTensor``). ``tensor_scales``: one fp32 S_dec per
    group (NVFP4), else None."""

    fmt: Format
    codes: torch.Tensor
    scales: torch.Tensor
    tensor_scales: torch.Tensor | None
    shape: torch.Size
    tile_rows: int = 1

    def group(self, g: int, rows: slice | None = None) -> QuantizedTensor:
        """Group ``g``'s quantization: rows ``rows`` of token groups, or batch item ``g``."""
        ts = None if self.tensor_scales is None else self.tensor_scales[g]
        if len(self.shape) == 2:
            n = len(range(*rows.indices(self.shape[0])))
            return QuantizedTensor(self.fmt, self.codes[rows], self.scales[rows], ts, 1,
                                   torch.Size((n, self.shape[1])), self.tile_rows)
        return QuantizedTensor(self.fmt, self.codes[g], self.scales[g], ts, 0, self.shape[1:], self.tile_rows)


def normalize_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for a tensor with {ndim} dims")
    return axis % ndim


def check_blocks(x: torch.Tensor, fmt: Format, axis: int, tile_rows: int = 1) -> int:
    """Validate ``x`` for quantizing along ``axis`` in whole blocks (and square tiles of ``tile_rows``); returns
    the normalized axis."""
    if not x.dtype.is_floating_point:
        raise TypeError(f"{fmt.name} quantize needs a floating-point tensor, got {x.dtype}")
    if x.ndim == 0:
        raise ValueError(f"{fmt.name} quantize needs at least one dimension, got a scalar")
    axis = normalize_axis(axis, x.ndim)
    k = x.shape[axis]
    if k % fmt.block_size:
        raise ValueError(
            f"{fmt.name}: dim {axis} of shape {tuple(x.shape)} has size {k}, "
            f"not a multiple of the block size {fmt.block_size}"
        )
    if tile_rows > 1:
        tiles = f"{tile_rows}x{tile_rows} tiles"
        if x.ndim != 2:
            raise ValueError(f"{fmt.name}: {tiles} need a 2D tensor, got shape {tuple(x.shape)}")
        if x.shape[1 - axis] % tile_rows:
            raise ValueError(f"{fmt.name}: {tiles} need both dims of shape {tuple(x.shape)} to be multiples of "
                             f"{tile_rows}")
    return axis


def blocked_view(x: torch.Tensor, fmt: Format, axis: int, tile_rows: int = 1) -> torch.Tensor:
    """fp32 ``x`` with ``axis`` moved last, after :func:`check_blocks`."""
    axis = check_blocks(x, fmt, axis, tile_rows)
    return x.to(torch.float32).movedim(axis, -1).contiguous()


def as_blocks(x: torch.Tensor, block: int, tile_rows: int) -> torch.Tensor:
    """A blocked view's blocks: (..., K) -> (..., K/block, block), or with square tiles (``tile_rows`` = the tile
    side) (R, K) -> (R/t, K/t, t·t), each tile's values in one row."""
    if tile_rows == 1:
        return x.unflatten(-1, (-1, block))
    r, k = x.shape
    t = tile_rows
    return x.reshape(r // t, t, k // t, t).permute(0, 2, 1, 3).flatten(-2)


def from_blocks(b: torch.Tensor, tile_rows: int) -> torch.Tensor:
    """The inverse of ``as_blocks``."""
    if tile_rows == 1:
        return b.flatten(-2)
    rb, kb, _ = b.shape
    t = tile_rows
    return b.unflatten(-1, (t, t)).permute(0, 2, 1, 3).reshape(rb * t, kb * t)


def block_amax(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block max|x| over the finite values (last dim) and the mask of blocks holding NaN/Inf.

    Non-finite blocks are marked by a NaN scale; leaving NaN/Inf out of the amax keeps their other
    codes meaningful and is what a GPU max-reduction gives.
    """
    finite = torch.isfinite(blocks)
    amax = torch.where(finite, blocks.abs(), torch.zeros_like(blocks)).amax(-1)
    return amax, ~finite.all(-1)


_COMPILED: dict = {}
# one compiled entry per flag combination (SR or not, tiles, element type, autograd keys): more than
# dynamo's default of 8 per function, and each is compiled once
CORE_RECOMPILE_LIMIT = 64


def reference_core(fn):
    """``fn`` itself, or with ``AUTOPREC_KERNELS=ref_inductor`` the same function compiled by inductor
    (the same arithmetic fused into one loop: several times faster emulation on CPU, after a
    compile of some seconds per function and flag combination)."""
    if kernel_mode() != "ref_inductor":
        return fn
    if fn not in _COMPILED:
        compiled = torch.compile(fn, dynamic=True)

        def run(*args):
            with torch._dynamo.config.patch(recompile_limit=CORE_RECOMPILE_LIMIT):
                return compiled(*args)

        _COMPILED[fn] = run
    return _COMPILED[fn]


@dataclass(frozen=True)
class QuantCopy:
    """One of the two copies ``quantize_dual`` writes of a 2D tensor: ``seed`` its SR stream (None: round to
    nearest), the RHT along its block axis, and ``transposed_source``: it is the quantization of x.t() (its
    SR bits index x.t()), as a graph's wgrad operand read through a transpose is."""

    seed: int | StepStream | None = None
    rht: bool = False
    transposed_source: bool = False

    def source(self, x: torch.Tensor, axis: int) -> tuple[torch.Tensor, int]:
        """(tensor, axis) this copy is the quantization of, for the copy of 2D ``x`` blocked along ``axis``."""
        return (x.t(), 1 - axis) if self.transposed_source else (x, axis)
