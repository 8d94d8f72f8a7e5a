"""Compile the tensor-core GEMM for sm_90 and sm_100 without a GPU and report, as JSON on stdout, whether its
PTX uses tensor-core MMA and what the cubin needs (registers, stack, shared memory). Run in a process
without TRITON_INTERPRET (the interpreter replaces Triton's compiler): ``python tests/ptx_report.py``."""
from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from autoprec.formats import get_format
from autoprec.kernels import scaled_mm_tc_triton as tc

POINTERS = {"a_codes": "*u8", "a_scales": "*u8", "a_ts": "*fp32", "b_codes": "*u8", "b_scales": "*u8",
            "b_ts": "*fp32", "bias_ptr": "*fp32", "out_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32"}
KINDS = {"nvfp4": 0, "mxfp8": 1, "mxfp8_e5m2": 1, "bf16": 2}


def constexprs(fmt: str) -> dict:
    elem = get_format(fmt).elem
    meta = {"KIND": KINDS[fmt], "EBITS": elem.ebits, "MBITS": elem.mbits, "BIAS": elem.bias,
            "INF": fmt == "mxfp8_e5m2"}
    out = {f"A_{k}": v for k, v in meta.items()} | {f"B_{k}": v for k, v in meta.items()}
    return out | {"B_TILE_ROWS": 1, "HAS_BIAS": True, "OUT_BF16": True, "BM": tc.BLOCK_M, "BN": tc.BLOCK_N,
                  "BK": tc.BLOCK_K, "INTERPRETED": False}


def resource_usage(cubin: bytes) -> dict:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", text)
    return {"regs": int(m.group(1)), "stack": int(m.group(2))} if m else {}


def report(fmt: str, cap: int) -> dict:
    const = constexprs(fmt)
    src = ASTSource(tc.scaled_mm_tc_kernel, POINTERS | {k: "constexpr" for k in const}, const)
    k = triton.compile(src, target=GPUTarget("cuda", cap, 32),
                       options={"num_warps": tc.NUM_WARPS, "num_stages": tc.NUM_STAGES})
    ptx = k.asm["ptx"]
    return {"fmt": fmt, "cap": cap, "wgmma": "wgmma.mma_async" in ptx, "tcgen05": "tcgen05.mma" in ptx,
            "shared": k.metadata.shared, **resource_usage(k.asm["cubin"])}


if __name__ == "__main__":
    print(json.dumps([report(fmt, cap) for fmt in ("nvfp4", "mxfp8") for cap in (90, 100)]))
