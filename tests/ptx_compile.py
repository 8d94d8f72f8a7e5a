"""How the PTX report compiles one kernel for a GPU target on a CPU machine and what it reads off the result: the PTX's
tensor-core MMA, fused multiply-adds, hashed SR bits, vector loads and hardware format conversions, the cubin's
registers, stack and SASS instruction count (Triton's bundled ``cuobjdump``). ``tests/ptx_report.py`` lists the
kernels and targets."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from autoprec.kernels.core.launch import FP4_CONVERSIONS, FP8_CONVERSIONS
from autoprec.kernels.triton import quantize_dual as qd
from autoprec.kernels.triton import quantize_rows as qt


def cuobjdump(cubin: bytes, flag: str) -> str:
    """What Triton's bundled ``cuobjdump`` prints for ``cubin`` with ``flag``."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True).stdout


def resource_usage(cubin: bytes) -> dict:
    m = re.search(r"REG:(\d+) STACK:(\d+)", cuobjdump(cubin, "--dump-resource-usage"))
    return {"regs": int(m.group(1)), "stack": int(m.group(2))} if m else {}


def sass_instructions(cubin: bytes) -> int:
    """How many instructions the cubin's SASS has (a static count: loops unrolled by Triton count in full)."""
    return len(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]\s+)?[A-Z]", cuobjdump(cubin, "-sass")))


LAUNCH_ALIGNED = "aligned"  # a launch option of this report: compile as Triton specializes a launch (see below)


def fma_lines(ptx: str) -> list[str]:
    """The source lines (``file.py:line``, from the PTX's ``.loc`` records) of the PTX's fp32 fused multiply-adds:
    an FMA rounds once where the source's multiply then add round twice, unless the product is exact."""
    files = dict(re.findall(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', ptx, re.M))
    lines, loc = set(), "?:0"
    for line in ptx.splitlines():
        if m := re.match(r"\s*\.loc\s+(\d+)\s+(\d+)", line):
            loc = f"{os.path.basename(files.get(m.group(1), '?'))}:{m.group(2)}"
        elif re.match(r"\s*(@!?%p\d+\s+)?fma\.rn(\.ftz)?\.f32\b", line):
            lines.add(loc)
    return sorted(lines)


def report(name: str, kernel, signature: dict, const: dict, options: dict, cap: int, sass: bool = True) -> dict:
    """Compile one kernel for sm_``cap``. With ``options[LAUNCH_ALIGNED]``, every pointer is declared 16-byte
    aligned and every size and stride a multiple of 16, as Triton declares a launch's arguments that are (the
    SR keys excepted: never specialized); that is what lets it vectorize loads. Without ``sass``, no SASS
    instruction count (disassembling takes a fifth of a quantizer's report)."""
    options = dict(options)
    attrs = {}
    if options.pop(LAUNCH_ALIGNED, False):
        names = kernel.arg_names
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in signature.items()
                 if n not in const and n not in qt.KEY_ARGS + qd.DUAL_KEY_ARGS}
    if "HW" in kernel.arg_names:  # the hardware conversions, where a launch on this target takes them
        const = {"HW": hardware_level(kernel, cap)} | const
    src = ASTSource(kernel, signature | {k: "constexpr" for k in const}, const, attrs)
    k = triton.compile(src, target=GPUTarget("cuda", cap, 32), options=options)
    ptx = k.asm["ptx"]
    return {"kernel": name, "cap": cap, "wgmma": "wgmma.mma_async" in ptx, "tcgen05": "tcgen05.mma" in ptx,
            "mma_sync": "mma.sync" in ptx,  # the warp-level tensor-core MMA (sm_80 to sm_120)
            "sr_hash": str(0x21F0AAAD) in ptx or "21f0aaad" in ptx.lower(),  # mix32's multiplier
            "vector_loads": "ld.global.v4" in ptx, "fma_lines": fma_lines(ptx),
            "tma": "cp.async.bulk.tensor" in ptx,  # tiles copied by the Tensor Memory Accelerator
            "fp8_cvt": "cvt.rn.satfinite.e4m3x2.f32" in ptx or "cvt.rn.satfinite.e5m2x2.f32" in ptx,
            "fp4_cvt": "cvt.rn.satfinite.e2m1x2.f32" in ptx,
            "fp8_decode": "cvt.rn.f16x2.e4m3x2" in ptx or "cvt.rn.f16x2.e5m2x2" in ptx,
            **({"instructions": sass_instructions(k.asm["cubin"])} if sass else {}),
            "shared": k.metadata.shared, **resource_usage(k.asm["cubin"]), **per_thread(const, options)}


def hardware_level(kernel, cap: int) -> int:
    """The HW constexpr a launch of this kernel on sm_``cap`` takes: the NVFP4 quantizers' level
    (``launch.nvfp4_hardware``: 1 from sm_89, their block scales; 2 from sm_100, their elements too), else
    ``launch.hardware_fp8``'s (0 or 1)."""
    fp8 = cap >= 10 * FP8_CONVERSIONS[0] + FP8_CONVERSIONS[1]
    if "nvfp4" in kernel.__name__:
        return fp8 + (cap >= 10 * FP4_CONVERSIONS[0] + FP4_CONVERSIONS[1])
    return int(fp8)


def per_thread(const: dict, options: dict) -> dict:
    """A quantizer's elements per thread (its BR x BK tile over its threads), where the tile is a constexpr."""
    if "BR" not in const or "BK" not in const:  # (the GEMMs' tiles are BM x BN x BK)
        return {}
    return {"per_thread": const["BR"] * const["BK"] // (32 * options.get("num_warps", 4))}
