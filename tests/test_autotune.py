"""Every autotuned kernel benchmarks its tiles briefly (kernels/triton/autotune.py), and the brief benchmark is Triton's
with 5 ms of warm-up and 20 ms of repetitions."""
import importlib
import pkgutil

import pytest

pytest.importorskip("triton")
import triton.testing  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402

import autoprec.kernels as kernels  # noqa: E402
from autoprec.kernels.triton import autotune  # noqa: E402


def autotuned() -> dict[str, Autotuner]:
    found = {}
    for info in pkgutil.walk_packages(kernels.__path__, prefix="autoprec.kernels."):
        module = importlib.import_module(info.name)
        short = info.name.removeprefix("autoprec.kernels.")
        found.update({f"{short}.{n}": v for n, v in vars(module).items() if isinstance(v, Autotuner)})
    return found


def test_every_autotuned_kernel_takes_the_short_benchmark():
    tuned = autotuned()
    assert len(tuned) == 17, sorted(tuned)  # the single, K-grouped and batch (tiles, slices), one-read and token
    # group quantizers
    assert {name for name, k in tuned.items() if k._do_bench is not autotune.short_bench} == set()


def test_short_benchmark_is_do_bench_with_short_warm_up_and_repetitions(monkeypatch):
    seen = {}
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: seen.update(kw) or 1.0)
    assert autotune.short_bench(lambda: None, quantiles=(0.5, 0.2, 0.8)) == 1.0
    assert seen == {"warmup": 5, "rep": 20, "quantiles": (0.5, 0.2, 0.8)}
