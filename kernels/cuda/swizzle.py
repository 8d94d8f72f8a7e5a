"""Block scales in the layout Blackwell's block-scaled MMA reads (cuBLAS / ``torch.nn.functional.scaled_mm``
with ``SWIZZLE_32_4_4``; the same as ``tcgen05``'s scale-factor layout).

The (rows, cols) scale matrix — one scale per block of 16 (NVFP4) or 32 (MXFP8) along K, rows the M or N
of the GEMM — is zero-padded to whole 128-row x 4-column tiles. Tiles are laid out one after the other in
row-major order of (row tile, column tile), 512 entries each; inside a tile, the scale at row r and
column c sits at ``(r mod 32)·16 + (r div 32)·4 + c``: four 32-row bands interleaved column by column.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

TILE_ROWS, TILE_COLS, BAND = 128, 4, 32


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """The flat SWIZZLE_32_4_4 layout of a 2D scale matrix (any dtype that holds zero, the padding: E8M0 scales go
    as uint8), a padded copy read in the tile order (two kernels on a GPU)."""
    if scales.ndim != 2:
        raise ValueError(f"swizzle_scales needs a 2D (rows, cols) scale matrix, got shape {tuple(scales.shape)}")
    rows, cols = scales.shape
    row_tiles, col_tiles = -(-rows // TILE_ROWS), -(-cols // TILE_COLS)
    padded = F.pad(scales, (0, col_tiles * TILE_COLS - cols, 0, row_tiles * TILE_ROWS - rows))
    # (row tile, band, row in band, column tile, column) -> (row tile, column tile, row in band, band, column)
    bands = padded.view(row_tiles, TILE_ROWS // BAND, BAND, col_tiles, TILE_COLS)
    return bands.permute(0, 3, 2, 1, 4).flatten()
