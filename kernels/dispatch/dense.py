"""The one place that picks an implementation: Triton on CUDA, the fused C kernels on CPU
(``cpu.fused``; the reference where they cannot be built, with the reason in ``unavailable_reason()``).

The block-scaled matmul (``gemm_path``): on sm_100 and later, cuBLAS's native block-scaled GEMM
(``scaled_mm_native``: ``torch.nn.functional.scaled_mm`` with swizzled scales) where it takes the operands; else
the operands decoded to bf16 for a bf16 GEMM, cuBLAS's or Triton's as timed on the GPU (``scaled_mm_decoded``,
which recomputes in fp32, on the device, a product with values bf16 does not hold); in the interpreter or with
``AUTOPREC_KERNELS=triton``, Triton on tensor cores with tiles decoded in registers, or the fp32 Triton kernel for
MXFP8 scale exponents outside bf16's range. A batched (B, M, K) x (B, K, N) product runs as one grouped GEMM of B
equal groups on those devices (``batched``), not one GEMM per item. The GPU paths read no device value on the host.

``AUTOPREC_KERNELS=triton`` forces Triton (on CPU that needs TRITON_INTERPRET=1), ``=ref`` forces the
reference, ``=ref_inductor`` the reference compiled by inductor, ``auto`` (or unset) chooses by device.
All are bit-identical. A forced Triton run that a kernel does not support
raises with the kernel's reason; in ``auto`` mode such a call runs the reference, which is bit-exact
with the kernel, so nothing is lost but speed.
"""
from __future__ import annotations

import functools
import importlib.util
from dataclasses import replace

import torch

from autoprec.formats import FP8_BLOCK, NVFP4, Format, get_format

from ..core.launch import interpreting
from ..core.mode import kernel_mode
from ..core.operand import KERNEL_OUT_DTYPES, Operand, as_operand
from ..core.quantized import QuantCopy, QuantizedTensor
from ..core.random_bits import StepStream, sr_bits
from ..cpu import fused
from ..cuda.scaled_mm import NATIVE_CAPABILITY, native_problem, scaled_mm_native
from ..cuda.scaled_mm_blockwise import blockwise_problem, scaled_mm_blockwise
from ..reference.hadamard import rht_ref
from ..reference.nvfp4 import transpose_tiles_ref
from ..reference.quantize import check_quantize_args, dequantize_ref, quantize_ref

TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def triton_runtime_reason(device: torch.device) -> str | None:
    """Why Triton cannot run on ``device`` here (None when it can)."""
    if not _triton_installed():
        return "triton is not installed (pip install 'autoprec[triton]')"
    if device.type == "cuda":
        return None
    if interpreting() and device.type == "cpu":
        return None
    return f"Triton needs a CUDA tensor, or TRITON_INTERPRET=1 for CPU tensors; got device {device}"


@functools.cache
def _triton_installed() -> bool:
    """Whether triton can be imported (looked up once: each matmul and quantization asks)."""
    return importlib.util.find_spec("triton") is not None


def triton_problem(device: torch.device, reason: str | None) -> str | None:
    """Why a Triton kernel does not run here for an input it takes unless ``reason`` says why not; None where it
    runs (raises where ``AUTOPREC_KERNELS=triton`` forces it and it cannot)."""
    mode = kernel_mode()
    if mode in ("ref", "ref_inductor"):
        return f"AUTOPREC_KERNELS={mode}"
    reason = triton_runtime_reason(device) or reason
    if mode == "triton" and reason:
        raise ValueError(f"AUTOPREC_KERNELS=triton, but the Triton kernel cannot run: {reason}")
    if reason is None and mode != "triton" and device.type != "cuda":
        return f"device {device} runs the reference kernels (AUTOPREC_KERNELS=triton runs Triton's interpreter)"
    return reason


def use_triton(device: torch.device, reason: str | None) -> bool:
    """Whether a Triton kernel runs here (``triton_problem`` is None)."""
    return triton_problem(device, reason) is None


def quantize_dtype_problem(dtype: torch.dtype) -> str | None:
    """Why the Triton quantizer does not read this dtype; None when it does."""
    return None if dtype in TRITON_DTYPES else f"dtype {dtype} (the kernel reads float32, bfloat16 or float16)"


def quantize_supports(x: torch.Tensor, fmt: Format) -> str | None:
    """Why the Triton quantizer does not take this (already validated) input; None when it does."""
    return quantize_dtype_problem(x.dtype) or ("an empty tensor" if x.numel() == 0 else None)


def quantize(
    x: torch.Tensor,
    fmt: str | Format,
    axis: int = -1,
    *,
    rounding: str = "rne",
    seed: int | StepStream = 0,
    rand: torch.Tensor | None = None,
    tile2d: bool = False,
    scale_mode: str = "rceil",
    rht: bool = False,
    rht_signs: torch.Tensor | None = None,
    rows: slice | torch.Tensor | None = None,
    batches: slice | None = None,
    amax: torch.Tensor | None = None,
) -> QuantizedTensor:
    """Quantize ``x`` along ``axis`` (``quantize_ref``'s options), with the RHT along ``axis`` first
    when ``rht`` is set (fused into the Triton kernel).

    ``rows`` and ``batches`` return a part of the whole tensor's quantization, with the same codes, block
    scales, tensor scale and SR bits; the fused CPU kernels then quantize only that part. ``rows`` (block
    axis one of the last two dims, 1-D blocks; a slice or an index tensor) indexes the other of the two:
    rows when blocking along the last dim, else columns. ``batches`` indexes the leading dim of a 3D
    tensor (a batched product's operand). ``amax``: NVFP4's tensor amax bits (``check_amax``), used in place of the
    tensor's own on every path: computed already by the graph (the same bits, so the Triton quantizer skips its amax
    pass), or a static amax fixed beforehand (the RL phases' activation scales), above which blocks saturate."""
    fmt = check_quantize_args(x, fmt, axis, rounding, tile2d, scale_mode)
    check_amax(amax, fmt, rht)
    if (rows is not None or batches is not None) and (x.ndim < 2 or axis % x.ndim < x.ndim - 2 or tile2d):
        raise ValueError(f"quantize(rows=..., batches=...) needs the block axis among the last two dims and 1-D "
                         f"blocks; got axis {axis} of shape {tuple(x.shape)}, tile2d={tile2d}")
    if batches is not None and x.ndim != 3:
        raise ValueError(f"quantize(batches=...) needs a 3D tensor, got shape {tuple(x.shape)}")
    part = rows is not None or batches is not None
    if part and rand is None and _use_cpu_fused(x, fmt) and fmt is not FP8_BLOCK:  # (FP8-block: parts of the whole)
        return fused.quantize_cpu(x, fmt, axis, seed=int(seed) if rounding == "sr" else None, scale_mode=scale_mode,
                            rht=rht, rht_signs=rht_signs, rows=slice(None) if rows is None else rows, batches=batches,
                            amax=amax)
    q = _quantize_whole(x, fmt, axis, rounding, seed, rand, tile2d, scale_mode, rht, rht_signs, amax)
    return _part_of(q, rows, batches) if part else q


def quantize_dual(x: torch.Tensor, fmt: str | Format, rows: QuantCopy, cols: QuantCopy, *, scale_mode: str = "rceil",
                  rht_signs: torch.Tensor | None = None, amax: torch.Tensor | None = None
                  ) -> tuple[QuantizedTensor, QuantizedTensor]:
    """Both copies of 2D ``x``: rowwise (blocks along dim 1) and columnwise (along dim 0), each the bytes
    ``quantize`` makes of its source (x, or x.t() for a copy with ``transposed_source``). The one-read Triton
    kernel runs in the interpreter (``AUTOPREC_KERNELS=triton``); elsewhere (CPU, a GPU for now, shapes it does
    not take) they are two quantizations. ``amax``: ``quantize``'s, for both copies."""
    fmt = get_format(fmt)
    if fmt is FP8_BLOCK:  # no one-read kernel: the two copies are two of its quantizer's launches
        return quantize_copies(x, fmt, rows, cols, scale_mode=scale_mode, rht_signs=rht_signs, amax=amax)
    problem = quantize_supports(x, fmt) or (dual_problem(x, fmt) if x.ndim == 2 else f"a {x.ndim}D tensor")
    # A GPU runs the two single quantizers until the one-read kernel has passed tests/test_gpu_quantize.py on a GPU
    # (its bytes and fields pair by pair): the interpreter does not exercise a GPU's scheduling of its two stores.
    if use_triton(x.device, problem) and x.device.type != "cuda":
        from ..triton.quantize_dual import quantize_dual_triton

        check_amax(amax, fmt, rows.rht or cols.rht)  # (quantize_copies checks its own)
        return quantize_dual_triton(x, fmt, rows, cols, scale_mode=scale_mode, rht_signs_=rht_signs, amax=amax)
    return quantize_copies(x, fmt, rows, cols, scale_mode=scale_mode, rht_signs=rht_signs, amax=amax)


def quantize_copies(x: torch.Tensor, fmt: str | Format, rows: QuantCopy, cols: QuantCopy, *,
                    scale_mode: str = "rceil", rht_signs: torch.Tensor | None = None,
                    amax: torch.Tensor | None = None) -> tuple[QuantizedTensor, QuantizedTensor]:
    """``quantize_dual``'s two copies as two quantizations (what a GPU runs for now). Where Triton quantizes both
    to NVFP4, their tensor amaxes come from one read of ``x``: one amax where neither takes the RHT (x's, whichever
    way it is blocked; none given ``amax``, which it is), and with the RHT on one copy, its transform's and x's from
    one pass (``quantize_cols.pair_amax``)."""
    fmt = get_format(fmt)
    check_amax(amax, fmt, rows.rht or cols.rht)
    amaxes = (None, None)
    if fmt is NVFP4 and not (rows.rht and cols.rht) and not _use_cpu_fused(x, fmt) and use_triton(
            x.device, quantize_supports(x, fmt)):
        from ..triton.quantize_cols import pair_amax

        for copy, axis in ((rows, 1), (cols, 0)):
            src, axis = copy.source(x, axis)
            check_quantize_args(src, fmt, axis, "rne", False, scale_mode)
        amaxes = (amax, amax) if amax is not None else pair_amax(x, rows, cols, rht_signs)

    def one(copy: QuantCopy, axis: int, triton_amax: torch.Tensor | None) -> QuantizedTensor:
        src, axis = copy.source(x, axis)
        if triton_amax is not None:
            from ..triton.quantize import quantize_triton

            return quantize_triton(src, fmt, axis, seed=copy.seed, scale_mode=scale_mode, rht=copy.rht,
                                   rht_signs_=rht_signs, amax=triton_amax)
        return quantize(src, fmt, axis, rounding="rne" if copy.seed is None else "sr", seed=copy.seed or 0,
                        scale_mode=scale_mode, rht=copy.rht, rht_signs=rht_signs, amax=amax)

    return one(rows, 1, amaxes[0]), one(cols, 0, amaxes[1])


def check_amax(amax: torch.Tensor | None, fmt: Format, rht: bool) -> None:
    """Check a quantization's given tensor amax (None: none given): NVFP4's, of the tensor itself (not of its RHT),
    as the fp32 bits in one int32, the Triton quantizers' amax cell."""
    if amax is None:
        return
    if fmt is not NVFP4 or rht:
        raise ValueError(f"quantize(amax=...): a given amax is NVFP4's tensor amax of the tensor itself, "
                         f"got format {fmt.name}{' with the RHT' if rht else ''}")
    if amax.dtype != torch.int32 or amax.numel() != 1:
        raise ValueError(f"quantize(amax=...) takes the fp32 bits of the amax in one int32, got {amax.dtype} "
                         f"of shape {tuple(amax.shape)}")


def transpose_tiles(codes: torch.Tensor, scales: torch.Tensor, fmt: str | Format = "nvfp4"
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The uint8 codes and scales of a square-tiled matrix's transpose: NVFP4's 16x16 tiles by
    ``reference.nvfp4.transpose_tiles_ref`` (one Triton launch where Triton runs, else the reference's torch ops);
    FP8-block's 128x128 tiles are one code per byte and one fp32 scale per tile, transposed as they are."""
    if get_format(fmt) is FP8_BLOCK:
        dense = torch.contiguous_format  # (.contiguous() keeps a size-1 dim's stride, which .view() refuses)
        tiles = scales.view(torch.float32).t().clone(memory_format=dense)
        return codes.t().clone(memory_format=dense), tiles.view(torch.uint8)
    if use_triton(codes.device, None):
        from ..triton.transpose_tiles import transpose_tiles_triton

        return transpose_tiles_triton(codes.contiguous(), scales.contiguous())
    return transpose_tiles_ref(codes, scales)


def fp8_block_problem(rounding: str, rht: bool) -> str | None:
    """Why the Triton FP8-block quantizer does not take these options (None where it does): it rounds to nearest,
    as the FP8-block recipes do, and takes no RHT."""
    if rounding == "sr" or rht:
        return "the Triton fp8_block quantizer rounds to nearest without the RHT (the reference takes both)"
    return None


def dual_problem(x: torch.Tensor, fmt: Format) -> str | None:
    """Why the one-read kernel cannot quantize 2D ``x`` both ways (a dim not a multiple of the block)."""
    if x.shape[0] % fmt.block_size or x.shape[1] % fmt.block_size:
        return f"shape {tuple(x.shape)} is not a multiple of {fmt.block_size} in both dims"
    return None


def _quantize_whole(x, fmt: Format, axis: int, rounding: str, seed: int | StepStream, rand, tile2d: bool,
                    scale_mode: str, rht: bool, rht_signs, amax: torch.Tensor | None) -> QuantizedTensor:
    """One quantization of the whole tensor; only the Triton kernels take a ``StepStream`` as it is (its step
    read on the device), the other paths read its value."""
    if rand is None and _use_cpu_fused(x, fmt):
        return fused.quantize_cpu(x, fmt, axis, seed=int(seed) if rounding == "sr" else None, tile2d=tile2d,
                            scale_mode=scale_mode, rht=rht, rht_signs=rht_signs, amax=amax)
    rand = rand if rounding == "sr" else None
    if fmt is FP8_BLOCK:
        if use_triton(x.device, quantize_supports(x, fmt) or fp8_block_problem(rounding, rht)):
            from ..triton.quantize_fp8_block import quantize_fp8_block_triton

            return quantize_fp8_block_triton(x, axis, tile2d=tile2d)
    elif use_triton(x.device, quantize_supports(x, fmt)):
        from ..triton.quantize import quantize_triton

        stream = seed if rounding == "sr" and rand is None else None  # SR bits hashed in the kernel
        return quantize_triton(x, fmt, axis, rand=rand, seed=stream, tile2d=tile2d, scale_mode=scale_mode,
                               rht=rht, rht_signs_=rht_signs, amax=amax)
    if rounding == "sr" and rand is None:
        rand = sr_bits(x.shape, int(seed), x.device)
    if rht:
        x = rht_ref(x, axis, rht_signs)
    return quantize_ref(x, fmt, axis, rounding=rounding, rand=rand, tile2d=tile2d, scale_mode=scale_mode, amax=amax)


def _part_of(q: QuantizedTensor, rows: slice | torch.Tensor | None, batches: slice | None) -> QuantizedTensor:
    """Batch items ``batches`` and rows ``rows`` of the stored (moved) layout of a quantization blocked
    along one of its last two dims (rows of dim -2 when blocked along the last dim, else columns)."""
    codes, scales = q.codes, q.scales
    if batches is not None:
        codes, scales = codes[batches], scales[batches]
    if rows is not None:
        codes, scales = codes[..., rows, :], scales[..., rows, :]
    shape = list(q.shape)
    shape[-2 if q.axis == len(shape) - 1 else -1] = codes.shape[-2]
    if batches is not None:
        shape[0] = codes.shape[0]
    return replace(q, codes=codes, scales=scales, shape=torch.Size(shape))


def dequantize(q: QuantizedTensor) -> torch.Tensor:
    """fp32 values of ``q``: the fused CPU kernel, else the reference (elementwise, any device)."""
    if _use_cpu_fused(q.codes, q.fmt):
        return fused.dequantize_cpu(q)
    return dequantize_ref(q)


def _use_cpu_fused(x: torch.Tensor, fmt: Format) -> bool:
    """The fused C kernels serve non-empty CPU tensors of their formats in ``auto`` mode, when they could be built."""
    if fmt not in fused.FORMATS:
        return False
    if kernel_mode() != "auto" or x.device.type != "cpu" or x.numel() == 0 or x.dtype not in TRITON_DTYPES + (
            torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2):
        return False
    return fused.unavailable_reason() is None


def kernel_out_dtype(out_dtype: torch.dtype) -> torch.dtype:
    """The dtype a matmul kernel writes for a product rounded to ``out_dtype``: itself where the kernels write it,
    else float32 (then rounded once to ``out_dtype``: the same one rounding of the fp32 accumulator)."""
    return out_dtype if out_dtype in KERNEL_OUT_DTYPES else torch.float32


def scaled_mm_supports(a: Operand, b: Operand) -> str | None:
    """Why the Triton block-scaled matmul does not take these operands (None when it does)."""
    if a.rows == 0 or b.rows == 0 or a.k == 0:
        return "an empty operand"
    return None


def scaled_mm(
    a: QuantizedTensor | torch.Tensor,
    b: QuantizedTensor | torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``a @ b (+ bias)`` for a (M, K) blocked along K and b (K, N) blocked along K; either may be a plain
    bfloat16 tensor. Accumulates in fp32 and rounds once to ``out_dtype`` (any float dtype: one the kernels do not
    write, float16, is their fp32 product rounded once). Batches go through ``autoprec.kernels.scaled_mm``."""
    if len(a.shape) != 2:
        raise ValueError(f"dispatch.dense.scaled_mm takes 2D operands, got a of shape {tuple(a.shape)}; "
                         "autoprec.kernels.scaled_mm takes batches too")
    if kernel_out_dtype(out_dtype) != out_dtype:
        return scaled_mm(a, b, bias, torch.float32).to(out_dtype)
    oa, ob = as_operand(a, 1, "a"), as_operand(b, 0, "b")
    if oa.k != ob.k:
        raise ValueError(f"scaled_mm: reduction dims differ, a has K={oa.k} and b has K={ob.k}")
    if bias is not None and bias.shape != (ob.rows,):
        raise ValueError(f"scaled_mm: bias must have shape ({ob.rows},), got {tuple(bias.shape)}")
    device = oa.codes.device
    if FP8_BLOCK in (oa.fmt, ob.fmt):
        if blockwise_problem(device_capability(device), oa, ob) is None:
            return scaled_mm_blockwise(oa, ob, bias, out_dtype)
        triton_problem(device, "fp8_block operands run cuBLAS's blockwise GEMM (sm_90) or the reference product")
        return reference_scaled_mm(a, b, bias, out_dtype)
    if use_triton(device, scaled_mm_supports(oa, ob)):
        path, _ = gemm_path(device_capability(device), oa, ob)
        if path == "native":
            return scaled_mm_native(oa, ob, bias, out_dtype)
        if path == "decoded":
            from ..triton.scaled_mm_decoded import scaled_mm_decoded

            return scaled_mm_decoded(oa, ob, bias, out_dtype)
        if path == "tensor_core":
            from ..triton.scaled_mm_tc import scaled_mm_tc_triton

            return scaled_mm_tc_triton(oa, ob, bias, out_dtype)
        from ..triton.scaled_mm import scaled_mm_triton

        return scaled_mm_triton(oa, ob, bias, out_dtype)  # tiles decoded in fp32, fp32 dot
    return reference_scaled_mm(a, b, bias, out_dtype)


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """The compute capability of a CUDA device (None for any other device)."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def gemm_path(capability: tuple[int, int] | None, a: Operand, b: Operand) -> tuple[str, str | None]:
    """Which matmul runs these operands on a GPU of this compute capability (None: the Triton interpreter), and
    why the path before it in this order was not taken (None for the first). In ``auto`` mode: ``native``
    (cuBLAS's block-scaled GEMM, sm_100 and later), else ``decoded`` (operands decoded to bf16, then cuBLAS's or
    Triton's bf16 GEMM; values bf16 does not hold are found on the device and that product recomputed in fp32). Neither
    reads the operands' values on the host, which would wait for the GPU. With ``AUTOPREC_KERNELS=triton`` or in
    the interpreter, ``tensor_core`` (Triton, tiles decoded to bf16 in registers), or ``fp32`` (Triton, tiles in
    fp32) where MXFP8 scales leave bf16's exact range (checked on the host). The decoded path comes first on sm_90
    because it measured faster than the in-register one (``benchmarks/results/gpu_log.md``)."""
    why = None
    if capability is not None and capability >= NATIVE_CAPABILITY:
        why = ("AUTOPREC_KERNELS=triton" if kernel_mode() == "triton"
               else torch_api_problem("scaled_mm") or native_problem(a, b))
        if why is None:
            return "native", None
    if capability is not None and kernel_mode() != "triton":
        return "decoded", why
    from ..triton.scaled_mm_tc import exact_decode_problem  # Triton: imported where it runs

    inexact = exact_decode_problem(a) or exact_decode_problem(b)
    if inexact:
        return "fp32", "; ".join(r for r in (why, inexact) if r)
    return "tensor_core", why or ("the Triton interpreter" if capability is None else "AUTOPREC_KERNELS=triton")


def torch_api_problem(name: str) -> str | None:
    """Why this torch lacks ``torch.nn.functional.<name>`` with its scaling enums (older releases), or None."""
    functional = torch.nn.functional
    if not (hasattr(functional, name) and hasattr(functional, "ScalingType") and hasattr(functional, "SwizzleType")):
        return f"torch {torch.__version__} has no torch.nn.functional.{name} with ScalingType / SwizzleType"
    return None


# CPU BLAS takes another path for a product of 1 to 3 rows (its results differ from the same rows' in a bigger product
# in the last bits); from 4 rows on, a row's result does not depend on the others, as measured on the shapes of
# tests/test_rl_rollouts.py and more. The reference product pads fewer rows to 4 so that a row's output never depends
# on how many rows share the call: a token decoded alone equals the same token in a full forward (docs/rl.md).
ROW_FLOOR = 4


def reference_scaled_mm(a, b, bias, out_dtype: torch.dtype) -> torch.Tensor:
    """Dequantized fp32 (batched) matmul, bias added in fp32, one rounding to ``out_dtype``; each output row a
    function of its own row of ``a`` and of ``b`` only (``ROW_FLOOR``)."""
    va, vb = reference_values(a), reference_values(b)
    rows = va.shape[-2]
    if 0 < rows < ROW_FLOOR:
        padded = torch.cat([va, va.new_zeros(*va.shape[:-2], ROW_FLOOR - rows, va.shape[-1])], -2)
        y = torch.matmul(padded, vb)[..., :rows, :].contiguous()
    else:
        y = torch.matmul(va, vb)
    return (y if bias is None else y + bias.to(torch.float32)).to(out_dtype)


def reference_values(x: QuantizedTensor | torch.Tensor) -> torch.Tensor:
    """The fp32 values ``reference_scaled_mm`` multiplies for operand ``x``."""
    return dequantize(x) if isinstance(x, QuantizedTensor) else x.to(torch.float32)


def runs_reference(device: torch.device) -> bool:
    """Whether products of non-empty operands on ``device`` run ``reference_scaled_mm`` (no Triton here)."""
    return not use_triton(device, None)
