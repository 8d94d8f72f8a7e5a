"""The fused CPU quantizer: ``csrc/`` (row kernels, column kernels for blocks that run across memory
rows, shared element arithmetic) built on first use with the system C compiler and called through
ctypes. Bit-identical to the pure-torch references (the suite compares them on edge data for every
format and option, in both memory layouts). The scale chains (NVFP4's tensor scale, E4M3 block scales,
E8M0 exponents) and the per-element work (RHT, rounding with the SR bits hashed in place, packing,
decoding) are C loops that repeat the references' fp32 operations.

``AUTOPREC_CC`` names the compiler (default ``cc``); the library is cached under ``AUTOPREC_CACHE``
(default ``~/.cache/autoprec``, or the temp dir without a home directory), keyed by the sources, flags,
compiler and CPU.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import torch

from autoprec.formats import FP8_BLOCK, MXFP8, MXFP8_E5M2, NVFP4, Format

from ..core.quantized import QuantizedTensor, blocked_view, check_blocks, normalize_axis
from ..core.random_bits import stream_keys
from ..reference.hadamard import rht_signs
from ..reference.mxfp8 import MX_BLOCK
from ..reference.nvfp4 import BLOCK

FORMATS = (NVFP4, MXFP8, MXFP8_E5M2, FP8_BLOCK)  # the formats these kernels quantize and dequantize

CSRC = Path(__file__).with_name("csrc")
SOURCES = [CSRC / "quantize_cpu.c", CSRC / "quantize_cols.c", CSRC / "fp8_block.c"]
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-ffp-contract=off", "-fno-math-errno", "-std=c11",
         "-shared", "-fPIC"]
_I64, _F32, _U32, _INT, _PTR = ctypes.c_int64, ctypes.c_float, ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p
SIGNATURES = {
    "block_amax": [_PTR, _I64, _I64, _I64, _PTR, _PTR],
    "nvfp4_round_pack": [_PTR, _PTR, _I64, _I64, _PTR, _INT, _U32, _U32, _I64, _PTR, _PTR],
    "mx_quantize": [_PTR, _PTR, _I64, _I64, _INT, _INT, _F32, _INT, _INT, _INT, _U32, _U32, _I64, _PTR, _PTR, _PTR],
    "nvfp4_scales": [_PTR, _PTR, _I64, _F32, _F32, _PTR, _PTR],
    "nvfp4_dequantize": [_PTR, _I64, _I64, _PTR, _PTR, _F32, _PTR],
    "mx_dequantize": [_PTR, _I64, _I64, _PTR, _PTR, _INT, _INT, _PTR],
    "rht16": [_PTR, _I64, _I64, _PTR, _PTR],
    "rht16_amax": [_PTR, _I64, _I64, _PTR, _PTR],
    "nvfp4_tensor_scale": [_PTR, _I64, _PTR],
    "nvfp4_quantize": [_PTR, _PTR, _I64, _I64, _I64, _PTR, _PTR, _I64, _INT, _U32, _U32, _PTR, _PTR, _PTR, _PTR,
                       _PTR],
    "mx_quantize_cols": [_PTR, _I64, _I64, _I64, _INT, _INT, _F32, _INT, _INT, _INT, _U32, _U32, _I64, _I64, _PTR,
                         _PTR],
    "nvfp4_quantize_cols": [_PTR, _I64, _I64, _I64, _F32, _F32, _INT, _U32, _U32, _I64, _I64, _PTR, _PTR],
    "rht16_cols": [_PTR, _I64, _I64, _I64, _PTR, _PTR],
    "fp8_block_quantize": [_PTR, _I64, _I64, _I64, _INT, _U32, _U32, _I64, _PTR, _PTR],
    "fp8_block_dequantize": [_PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR],
}


def _cpu_key() -> str:
    try:
        flags = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")][:1]
    except OSError:
        flags = []
    return "".join(flags)


def _cache_dir() -> Path:
    """``AUTOPREC_CACHE``, else ``~/.cache/autoprec``, else (no home directory) a folder under the temp dir."""
    if os.environ.get("AUTOPREC_CACHE"):
        return Path(os.environ["AUTOPREC_CACHE"])
    try:
        return Path.home() / ".cache" / "autoprec"
    except RuntimeError:
        return Path(tempfile.gettempdir()) / "autoprec-cache"


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, str | None]:
    """The built library, or None and why it could not be built."""
    cc = os.environ.get("AUTOPREC_CC", "cc")
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        return None, f"no C compiler ({cc}: {exc}); set AUTOPREC_CC"
    src = b"".join(f.read_bytes() for f in [*SOURCES, CSRC / "numerics.h"])
    key = hashlib.sha256(src + " ".join(FLAGS + [version, _cpu_key()]).encode()).hexdigest()[:16]
    cache = _cache_dir()
    lib = cache / f"quantize_cpu_{key}.so"
    try:
        if not lib.exists():
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache) as tmp:  # built aside, then moved: safe across processes
                out = Path(tmp) / lib.name
                run = subprocess.run([cc, *FLAGS, *map(str, SOURCES), "-o", str(out), "-lm"], capture_output=True,
                                     text=True)
                if run.returncode:
                    return None, f"{cc} failed to build {CSRC}: {run.stderr.strip()[:300]}"
                os.replace(out, lib)
        dll = ctypes.CDLL(str(lib))
    except OSError as exc:
        return None, f"cannot build or load {lib} ({exc}); set AUTOPREC_CACHE to a writable folder"
    for name, args in SIGNATURES.items():
        getattr(dll, name).argtypes = args
        getattr(dll, name).restype = None
    return dll, None


def unavailable_reason() -> str | None:
    """Why the fused CPU kernels cannot run here (None when they can)."""
    return _library()[1]


def _lib() -> ctypes.CDLL:
    dll, why = _library()
    if dll is None:
        raise RuntimeError(f"autoprec fused CPU kernels unavailable: {why}")
    return dll


def _call(name: str, *args) -> None:
    """Call C function ``name``; tensors pass as data pointers, None as NULL (``args`` keeps them alive)."""
    c_args = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if not a.is_contiguous():
                raise ValueError(f"{name}: tensor arguments must be contiguous")
            a = a.data_ptr()
        c_args.append(a)
    getattr(_lib(), name)(*c_args)


def _layout(x: torch.Tensor, axis: int) -> tuple[int, int, int]:
    """(rows, K, inner) for the C loops: the moved (rows, K) view and the size after the block axis,
    which maps a moved position back to its index in x for the SR bits. With the block axis last
    (inner 1) the view is one long row: blocks never straddle rows, and the loops run longer."""
    k = x.shape[axis]
    rows = x.numel() // k if k else 0
    inner = int(torch.Size(x.shape[axis + 1:]).numel())
    return (1, rows * k, 1) if inner == 1 else (rows, k, inner)


def _sr_keys(seed: int | None) -> tuple[int, int, int]:
    if seed is None:
        return 0, 0, 0
    k1, k2 = stream_keys(seed)
    return 1, k1, k2


def _c_signs(signs: torch.Tensor | None) -> torch.Tensor:
    """The RHT's 16 signs as the C kernels read them (contiguous fp32; the default seed's when None)."""
    return (rht_signs() if signs is None else signs).to(torch.float32).contiguous()


def _rht(xm: torch.Tensor, signs: torch.Tensor | None) -> torch.Tensor:
    y = torch.empty_like(xm)
    _call("rht16", xm, xm.numel() // xm.shape[-1], xm.shape[-1], _c_signs(signs), y)
    return y


def _amax(xm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per 16-block amax over the finite values and the uint8 flags of blocks holding NaN/Inf."""
    rows, k = xm.numel() // xm.shape[-1], xm.shape[-1]
    amax = torch.empty(xm.shape[:-1] + (k // BLOCK,), dtype=torch.float32)
    bad = torch.empty(amax.shape, dtype=torch.uint8)
    _call("block_amax", xm, rows, k, BLOCK, amax, bad)
    return amax, bad


def _tensor_scale(values: torch.Tensor) -> tuple[float, torch.Tensor]:
    """NVFP4's factor f = S_enc * fp32(1/6) for the block scales and S_dec = 1/S_enc, from the finite max
    |.| of ``values`` (contiguous fp32: the block amaxes, or the whole tensor), as ``nvfp4_encode_scale``
    and ``scale_to_block`` compute them."""
    out = torch.empty(2, dtype=torch.float32)
    _call("nvfp4_tensor_scale", values, values.numel(), out)
    return float(out[0]), out[1].clone()


def _nvfp4_scales(amax: torch.Tensor, bad: torch.Tensor, given: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference's scale chain (``nvfp4_core``) in C, from the block (or tile) amaxes; the tensor scale from
    ``given`` (a static tensor amax, one fp32) where there is one."""
    f, s_dec = _tensor_scale(amax if given is None else given)
    s_b, e_b = torch.empty_like(amax), torch.empty_like(amax)
    _call("nvfp4_scales", amax, bad, amax.numel(), f, float(s_dec), s_b, e_b)
    return s_b, e_b, s_dec


def _dense(x: torch.Tensor) -> torch.Tensor:
    """``x``'s values in contiguous memory (any order), without a copy when it is a transposed view."""
    if x.is_contiguous() or not x.transpose(-1, -2).is_contiguous():
        return x.contiguous()
    return x.transpose(-1, -2)


def _column_source(x: torch.Tensor, axis: int) -> tuple[torch.Tensor, tuple[int, int]] | None:
    """For an input whose blocks run across memory rows (a (tokens, features) tensor blocked along the
    tokens, or a transposed view blocked along its last dim): the contiguous (B, K, R) array the column
    kernels read in place, and the (row, K) strides of the logical index for the SR bits. None otherwise."""
    v = x.movedim(axis, -1)
    if v.ndim < 2 or v.is_contiguous() or not v.transpose(-1, -2).is_contiguous():
        return None
    rows, k = v.shape[-2], v.shape[-1]
    inner = int(torch.Size(x.shape[axis + 1:]).numel())
    if inner not in (1, rows):
        return None
    return v.transpose(-1, -2), (k, 1) if inner == 1 else (1, rows)


def _quantize_cols(src: torch.Tensor, strides: tuple[int, int], fmt: Format, axis: int, shape: torch.Size,
                   seed: int | None, scale_mode: str, rht: bool, rht_signs: torch.Tensor | None,
                   given: torch.Tensor | None) -> QuantizedTensor:
    """``quantize_cpu`` through the column kernels (``src``, ``strides``: from ``_column_source``; ``given``: a
    static tensor amax)."""
    k, rows = src.shape[-2], src.shape[-1]
    batch = src.numel() // (k * rows)
    if rht:
        y = torch.empty_like(src)
        _call("rht16_cols", src, batch, k, rows, _c_signs(rht_signs), y)
        src = y
    sr, k1, k2 = _sr_keys(seed)
    stored = src.shape[:-2] + (rows, k)
    if fmt is NVFP4:
        f, s_dec = _tensor_scale(src if given is None else given)
        codes = torch.empty(stored[:-1] + (k // 2,), dtype=torch.uint8)
        s_b = torch.empty(stored[:-1] + (k // BLOCK,), dtype=torch.float32)
        _call("nvfp4_quantize_cols", src, batch, k, rows, f, float(s_dec), sr, k1, k2, *strides, codes, s_b)
        return QuantizedTensor(NVFP4, codes, s_b.to(torch.float8_e4m3fn), s_dec, axis, shape)
    elems = torch.empty(stored, dtype=torch.uint8)
    scales = torch.empty(stored[:-1] + (k // MX_BLOCK,), dtype=torch.uint8)
    e = fmt.elem
    _call("mx_quantize_cols", src, batch, k, rows, e.mbits, e.bias, e.max, e.emax, int(scale_mode == "floor"), sr, k1,
          k2, *strides, elems, scales)
    return QuantizedTensor(fmt, elems.view(e.torch_dtype), scales, None, axis, shape)


def _row_bases(shape: torch.Size, axis: int, rows: slice | torch.Tensor, batches: slice | None) -> torch.Tensor:
    """Flat index of the first element of each selected row of the moved (rows, K) view, for the SR bits
    (the rest of a row follows at stride 1 with the block axis last, else at stride shape[-1])."""
    if isinstance(rows, slice):  # calibration's samples: the same few every step
        return _sliced_row_bases(tuple(shape), axis, (rows.start, rows.stop, rows.step),
                                 None if batches is None else (batches.start, batches.stop, batches.step))
    return _bases(shape, axis, rows, batches)


@functools.lru_cache(maxsize=1024)
def _sliced_row_bases(shape: tuple[int, ...], axis: int, rows: tuple, batches: tuple | None) -> torch.Tensor:
    return _bases(torch.Size(shape), axis, slice(*rows), None if batches is None else slice(*batches))


def _bases(shape: torch.Size, axis: int, rows: slice | torch.Tensor, batches: slice | None) -> torch.Tensor:
    batch = torch.arange(shape[:-2].numel())
    batch = (batch if batches is None else batch[batches]).unsqueeze(1) * shape[-2] * shape[-1]
    last = axis == len(shape) - 1
    picked = torch.arange(shape[-2] if last else shape[-1])[rows]
    per_row = picked * shape[-1] if last else picked
    return (batch + per_row).reshape(-1).contiguous()


@functools.lru_cache(maxsize=1024)
def _row_offsets(shape: tuple[int, ...], strides: tuple[int, ...]) -> torch.Tensor:
    """Offset in elements of each row of a (..., rows, K) view with unit stride along K from its first element."""
    offsets = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(shape[:-1], strides[:-1]):
        offsets = offsets.unsqueeze(-1) + torch.arange(size) * stride
    return offsets.reshape(-1).contiguous()


def _source(xm: torch.Tensor, src_row: torch.Tensor | None) -> torch.Tensor | int:
    """What the C quantizers read: ``xm`` itself when contiguous, else (rows at ``src_row``) its data pointer;
    the caller keeps ``xm`` alive through the call."""
    return xm if src_row is None else xm.data_ptr()


def _tile_rows(t: torch.Tensor, reduce) -> torch.Tensor:
    """(R, K/16) per-row-block values -> (R/16, K/16) per 16x16 tile."""
    return reduce(t.unflatten(0, (-1, BLOCK)), 1)


def quantize_cpu(
    x: torch.Tensor, fmt: Format, axis: int, *, seed: int | None = None, tile2d: bool = False,
    scale_mode: str = "rceil", rht: bool = False, rht_signs: torch.Tensor | None = None,
    rows: slice | torch.Tensor | None = None, batches: slice | None = None, amax: torch.Tensor | None = None,
) -> QuantizedTensor:
    """``dispatch.quantize`` on CPU for a validated, non-empty input: ``seed`` (the SR stream) selects
    stochastic rounding; ``rows`` (no tiles) quantizes only those indices of the other matrix dim
    (dim -2 when blocking along the last dim, the last dim when blocking along dim -2), of the batch items
    ``batches`` (a 3D input's leading dim), with the whole tensor's tensor scale and SR bits. ``amax``: NVFP4's
    tensor amax given (int32 fp32 bits, ``dispatch.check_amax``), in place of the tensor's own."""
    axis = normalize_axis(axis, x.ndim)
    if fmt is FP8_BLOCK:
        return _fp8_block(x, axis, seed, tile2d, rht, rht_signs)
    given = None if amax is None else amax.reshape(1).view(torch.float32).cpu()
    tile_rows = BLOCK if tile2d else 1
    x = x.to(torch.float32)  # once (a no-op for fp32; keeps a transposed view's strides)
    if rows is None and not tile2d:
        check_blocks(x, fmt, axis)
        cols = _column_source(x, axis)
        if cols is not None:
            return _quantize_cols(*cols, fmt, axis, x.shape, seed, scale_mode, rht, rht_signs, given)
    # NVFP4's tensor scale from: a given amax, else (a part of the rows) the whole tensor's values, else the blocks'
    shape, whole, row_base, src_row = x.shape, given, None, None
    if rows is None:
        xm = blocked_view(x, fmt, axis, tile_rows)
        if rht:
            xm = _rht(xm, rht_signs)
        n_rows, n, inner = _layout(x, axis)
    else:  # a part of the whole (transformed) tensor, which also gives NVFP4's tensor scale
        check_blocks(x, fmt, axis)
        moved = x.movedim(axis, -1)
        if fmt is NVFP4 and whole is None and rht:  # the transformed whole's finite amax, without writing the transform
            whole = torch.empty(1)
            flat = moved.contiguous()
            _call("rht16_amax", flat, flat.numel() // flat.shape[-1], flat.shape[-1], _c_signs(rht_signs), whole)
        elif fmt is NVFP4 and whole is None:
            whole = _dense(moved)
        row_base = _row_bases(x.shape, axis, rows, batches)
        xm = (moved if batches is None else moved[batches])[..., rows, :]
        if rht or xm.stride(-1) != 1:
            xm = _rht(xm.contiguous(), rht_signs) if rht else xm.contiguous()
        elif not xm.is_contiguous():  # the rows are read in place
            src_row = _row_offsets(tuple(xm.shape), xm.stride())
        last = axis == x.ndim - 1
        shape = list(x.shape)
        shape[-2 if last else -1] = xm.shape[-2]
        shape[0] = xm.shape[0] if batches is not None else shape[0]
        # each selected row at the whole tensor's stride along K (for the SR bits)
        n_rows, n, inner = row_base.numel(), xm.shape[-1], 1 if last else x.shape[-1]
    k = xm.shape[-1]
    sr, k1, k2 = _sr_keys(seed)
    if fmt is NVFP4 and not tile2d:
        nb = xm.numel() // BLOCK
        scratch, bad = torch.empty(3 * nb), torch.empty(nb, dtype=torch.uint8)
        scales = torch.empty(xm.shape[:-1] + (k // BLOCK,), dtype=torch.uint8)
        s_dec, codes = torch.empty(()), torch.empty(xm.shape[:-1] + (k // 2,), dtype=torch.uint8)
        n_whole = 0 if whole is None else whole.numel()
        _call("nvfp4_quantize", _source(xm, src_row), src_row, n_rows, n, inner, row_base, whole, n_whole, sr, k1, k2,
              scratch, bad, scales, s_dec, codes)
        return QuantizedTensor(NVFP4, codes, scales.view(torch.float8_e4m3fn), s_dec, axis, torch.Size(shape))
    if fmt is NVFP4:
        amax, bad = _amax(xm)
        if tile2d:
            amax, bad = _tile_rows(amax, torch.amax), _tile_rows(bad, torch.amax)
        s_b, e_b, s_dec = _nvfp4_scales(amax.contiguous(), bad.contiguous(), given)
        e_rows = e_b.repeat_interleave(BLOCK, 0) if tile2d else e_b
        codes = torch.empty(xm.shape[:-1] + (k // 2,), dtype=torch.uint8)
        _call("nvfp4_round_pack", xm, None, n_rows, n, e_rows.contiguous(), sr, k1, k2, inner, row_base, codes)
        return QuantizedTensor(NVFP4, codes, s_b.to(torch.float8_e4m3fn), s_dec, axis, torch.Size(shape), tile_rows)
    elems = torch.empty(xm.shape, dtype=torch.uint8)
    scales = torch.empty(xm.shape[:-1] + (k // MX_BLOCK,), dtype=torch.uint8)
    e = fmt.elem
    _call("mx_quantize", _source(xm, src_row), src_row, n_rows, n, e.mbits, e.bias, e.max, e.emax,
          int(scale_mode == "floor"), sr, k1, k2, inner, row_base, elems, scales)
    return QuantizedTensor(fmt, elems.view(fmt.elem.torch_dtype), scales, None, axis, torch.Size(shape))


def _fp8_block(x: torch.Tensor, axis: int, seed: int | None, tile2d: bool, rht: bool,
               rht_signs: torch.Tensor | None) -> QuantizedTensor:
    """FP8-block codes and fp32 scales of the whole of ``x`` (``dispatch`` cuts parts from it: its 1x128 blocks
    share nothing across rows)."""
    tile = FP8_BLOCK.tile if tile2d else 1
    xm = blocked_view(x, FP8_BLOCK, axis, tile)
    if rht:
        xm = _rht(xm, rht_signs)
    k = xm.shape[-1]
    rows = xm.numel() // k
    sr, k1, k2 = _sr_keys(seed)
    codes = torch.empty(xm.shape, dtype=torch.uint8)
    scales = torch.empty((rows // tile, k // FP8_BLOCK.block_size) if tile2d else xm.shape[:-1] + (
        k // FP8_BLOCK.block_size,), dtype=torch.float32)
    inner = int(torch.Size(x.shape[axis + 1:]).numel())
    _call("fp8_block_quantize", xm, rows, k, tile, sr, k1, k2, inner, codes, scales)
    return QuantizedTensor(FP8_BLOCK, codes.view(torch.float8_e4m3fn), scales, None, axis, x.shape, tile)


@functools.cache
def _fp8_table(dtype: torch.dtype) -> torch.Tensor:
    """torch's fp32 value of each of the 256 bytes of an FP8 dtype (E4M3 block scales are decoded with it;
    FP8 elements take their Inf/NaN values from it)."""
    return torch.arange(256, dtype=torch.uint8).view(dtype).to(torch.float32)


def dequantize_cpu(q: QuantizedTensor) -> torch.Tensor:
    """fp32 values of ``q`` in its logical layout (a view with the block axis moved back)."""
    codes = q.codes.contiguous().view(torch.uint8)
    k = q.shape[q.axis]
    out = torch.empty(codes.shape[:-1] + (k,), dtype=torch.float32)
    rows = out.numel() // k if k else 0
    if q.fmt is FP8_BLOCK:
        _call("fp8_block_dequantize", codes, rows, k, q.tile_rows, _fp8_table(torch.float8_e4m3fn),
              q.scales.contiguous(), out)
    elif q.fmt is NVFP4:
        scale = q.scales.view(torch.uint8)
        scale = (scale.repeat_interleave(BLOCK, 0) if q.tile_rows > 1 else scale).contiguous()
        _call("nvfp4_dequantize", codes, rows, k, scale, _fp8_table(torch.float8_e4m3fn), float(q.tensor_scale), out)
    else:
        e = q.fmt.elem
        _call("mx_dequantize", codes, rows, k, _fp8_table(e.torch_dtype), q.scales.contiguous(), e.mbits, e.bias, out)
    return out.movedim(-1, q.axis)
