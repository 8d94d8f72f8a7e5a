"""Where ``kernels_gpu.py``'s sections run, at what sizes, and how they are timed: on the CUDA GPU at the issue's
shapes, or (``--dry-run``) once each on the CPU at tiny ones."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rig:
    """Where the sections run and at what sizes: the GPU's (the defaults), or a dry run's tiny CPU ones."""
    device: str = "cuda"
    dry: bool = False
    matmul_shapes: tuple[tuple[int, int, int], ...] = ((4096, 4096, 4096), (8192, 8192, 2048))
    experts: int = 8  # the grouped sections: experts, tokens (split evenly), K and N
    tokens: int = 16384
    width: int = 2048
    bmm: tuple[int, int, int, int] = (64, 2048, 2048, 128)  # batch, M, N, K
    gpt: tuple[int, int, int, int, int] = (1024, 16, 1024, 8, 50304)  # d, heads, ctx, batch, vocab

    def capability(self) -> tuple[int, int]:
        """The GPU's compute capability; a dry run's stands for an sm_90 GPU."""
        return (9, 0) if self.dry else torch.cuda.get_device_capability()

    def bench(self, fn) -> float:
        """Milliseconds per call of ``fn`` (Triton's ``do_bench``); a dry run calls it once and times that."""
        if self.dry:
            began = time.perf_counter()
            fn()
            return max((time.perf_counter() - began) * 1e3, 1e-6)
        import triton.testing

        return triton.testing.do_bench(fn)

    def output_and_ms(self, fn):
        """(one call's output, ``bench(fn)``): a dry run times that one call instead of calling ``fn`` again."""
        began = time.perf_counter()
        out = fn()
        if self.dry:
            return out, max((time.perf_counter() - began) * 1e3, 1e-6)
        return out, self.bench(fn)

    def sync(self) -> None:
        """Wait for the GPU's queued work (a dry run has none)."""
        if not self.dry:
            torch.cuda.synchronize()

    def per_step_ms(self, step) -> float:
        """Milliseconds per call of ``step`` over 5 calls, by CUDA events (a dry run: one call, wall clock)."""
        if self.dry:
            return self.bench(step)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            step()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 5


DRY = Rig(device="cpu", dry=True, matmul_shapes=((64, 64, 128), (128, 64, 64)), experts=4, tokens=256, width=64,
          bmm=(4, 64, 64, 32), gpt=(64, 4, 32, 2, 256))
