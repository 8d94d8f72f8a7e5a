"""The kernels address elements past 2**31 (a (tokens, vocab) logits tensor or its gradient of 16k x 152k has
2.5e9): offsets are int64, where int32 ones wrap and read or write outside the tensor. The quantizers are checked
on strided views whose rows lie 2**26 elements apart over a 4.4 GB allocation, of which only the rows read are
touched: each quantization equals that of the view's contiguous copy, bit for bit. The GEMMs' epilogue (its
store is every matmul kernel's) on the first column of tiles of a (33, 2**26) product; the bf16 wgrad on an operand
whose rows lie 2**24 elements apart, equal to the same product of its contiguous copy. Run in subprocesses, since a
wrapped offset crashes the Triton interpreter instead of failing."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")


def strided_rows(rows: int, cols: int, stride: int) -> str:
    """A script's opening: ``x``, a (rows, cols) bf16 view whose rows lie ``stride`` elements apart in one
    allocation (only the rows touched), filled with random values; the script prints SKIP where it cannot be had."""
    return f'''
import torch
ROWS, K, STRIDE = {rows}, {cols}, {stride}
try:
    store = torch.empty(STRIDE * (ROWS - 1) + K, dtype=torch.bfloat16)
except RuntimeError as e:
    print(f"SKIP no {2 * (stride * (rows - 1) + cols) / 1e9:.1f} GB allocation here: {{e}}")
    raise SystemExit
x = store.as_strided((ROWS, K), (STRIDE, 1))
x.copy_(torch.randn(ROWS, K, generator=torch.Generator().manual_seed(0)))
'''


# rows 32 and 33 start past 2**31 elements
SCRIPT = strided_rows(34, 64, 1 << 26) + r'''
from autoprec.formats import get_format
from autoprec.kernels.triton.quantize_grouped import quantize_row_groups_triton
from autoprec.kernels.triton.quantize_k_groups import quantize_k_groups_triton
from autoprec.kernels.triton.quantize import quantize_triton
from autoprec.kernels.core.random_bits import StepStream

dense = x.contiguous()
offs, step = torch.tensor([12, 12, 34], dtype=torch.int32), torch.tensor(2)


def same(a, b):
    a, b = (t if isinstance(t, (tuple, list)) else (t.codes, t.scales, t.tensor_scale) for t in (a, b))
    return all((u is None and v is None) or torch.equal(u.view(torch.uint8) if u.dtype != torch.float32 else u,
                                                        v.view(torch.uint8) if v.dtype != torch.float32 else v)
               for u, v in zip(a, b))


bad = []
for fmt in ("nvfp4", "mxfp8"):
    f = get_format(fmt)
    cases = {
        "rows": lambda v: quantize_triton(v, f, 1),
        "columns, SR, RHT": lambda v: quantize_triton(v, f, 0, seed=StepStream(7, step), rht=True),
        "token groups, SR": lambda v: quantize_row_groups_triton(v, f, offs, seed=3, step=step),
        "K groups, SR, RHT": lambda v: quantize_k_groups_triton(v, f, 0, offs, seed=3, step=step, rht=True)[:3],
    }
    for name, fn in cases.items():
        if not same(fn(x), fn(dense)):
            bad.append(f"{fmt} {name}")
print("MISMATCH " + ", ".join(bad) if bad else "OK")
'''


EPILOGUE = r'''
import torch
from autoprec.kernels.triton.scaled_mm_decoded import _epilogue_kernel

M, N, BM, BN = 33, 1 << 26, 32, 128  # row 32 of the (M, N) product, the second row tile, starts at 2**31 elements
try:
    acc = torch.empty(M * N, dtype=torch.float32).view(M, N)  # 8.9 GB of address space, and 4.4 GB for out
    out = torch.empty(M * N, dtype=torch.bfloat16).view(M, N)
except RuntimeError as e:
    print(f"SKIP no 13 GB of address space here: {e}")
    raise SystemExit
acc[:, :BN] = torch.randn(M, BN, generator=torch.Generator().manual_seed(0))
_epilogue_kernel[(2, 1)](acc, acc, acc, acc, out.view(torch.int16), M, N, 1, 1, HAS_BIAS=False, OUT_BF16=True,
                         BM=BM, BN=BN)  # the first column of tiles: MXFP8 operands (no tensor scales), no bias
print("OK" if torch.equal(out[:, :BN], acc[:, :BN].bfloat16()) else "MISMATCH")
'''


# rows 128 and 129 of the (M, T) operand, its second row tile, start past 2**31 elements
WGRAD = strided_rows(130, 40, 1 << 24) + r'''
from autoprec.kernels.triton.wgrad_bf16 import bf16_wgrad

a, T = x, K
b, offs = torch.randn(T, 24, generator=torch.Generator().manual_seed(1)).bfloat16(), torch.tensor([20, 40]).int()
same = torch.equal(bf16_wgrad(a, b, offs, torch.float32), bf16_wgrad(a.contiguous(), b, offs, torch.float32))
print("OK" if same else "MISMATCH")
'''


@pytest.mark.parametrize("script", [SCRIPT, EPILOGUE, WGRAD], ids=["quantizers", "gemm-epilogue", "bf16-wgrad"])
def test_kernels_address_elements_past_2_31(script):
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"rc {run.returncode} (-11: a wrapped offset read outside the tensor)\n{run.stderr}"
    last = run.stdout.strip().splitlines()[-1]
    if last.startswith("SKIP"):
        pytest.skip(last[5:])
    assert last == "OK"
