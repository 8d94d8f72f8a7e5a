"""sm_90's decoded GEMM takes cuBLAS's or Triton's product by measurement (``kernels/triton/gemm_choice.py``):
each key is
timed once, remembered in the process and on disk, pinned by AUTOPREC_DECODED_GEMM, never timed off a GPU. The
timer is a stand-in here (no GPU); the products run in Triton's interpreter."""
import pytest
import torch

pytest.importorskip("triton")

from autoprec.kernels import quantize_ref
from autoprec.kernels.core.operand import as_operand
from autoprec.kernels.triton import gemm_choice
from autoprec.kernels.triton import scaled_mm_decoded as dec

from helpers import to_device

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def timer(monkeypatch, tmp_path):
    """A fresh choice table and disk cache, products timeable on this device, and a stand-in for the benchmark
    that runs each candidate once and returns the time it was given: ``timer[name]`` (ms) by call order, the
    names of what it timed in ``timer["timed"]``."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(gemm_choice.ENV, raising=False)
    monkeypatch.setattr(gemm_choice, "_CHOSEN", {})
    monkeypatch.setattr(gemm_choice, "measurable", lambda device: True)
    state = {"cublas": 2.0, "triton": 1.0, "timed": []}

    def bench(fn):
        name = gemm_choice.PRODUCTS[len(state["timed"]) % 2]  # choose() times candidates in PRODUCTS' order
        state["timed"].append(name)
        fn()
        return state[name]

    monkeypatch.setattr(gemm_choice, "short_bench", bench)
    return state


def candidates(ran: list) -> dict:
    return {name: (lambda name=name: ran.append(name)) for name in gemm_choice.PRODUCTS}


def test_sm90_decoded_gemm_choice_times_each_key_once_and_keeps_it_on_disk(timer):
    ran, device = [], torch.device(DEVICE)
    assert gemm_choice.choose(("k", 1), candidates(ran), device) == "triton"
    assert timer["timed"] == ["cublas", "triton"] and ran == ["cublas", "triton"]
    assert gemm_choice.choose(("k", 1), candidates(ran), device) == "triton"  # remembered: not timed again
    assert len(timer["timed"]) == 2
    gemm_choice._CHOSEN.clear()  # a new process at the same key reads the disk
    assert gemm_choice.choose(("k", 1), candidates(ran), device) == "triton"
    assert len(timer["timed"]) == 2
    timer["cublas"] = 0.5  # another key is timed on its own
    assert gemm_choice.choose(("k", 2), candidates(ran), device) == "cublas"
    assert len(timer["timed"]) == 4
    assert gemm_choice.chosen() == {(device.type, device.index, "k", 1): "triton",
                                    (device.type, device.index, "k", 2): "cublas"}


def test_sm90_decoded_gemm_choice_pinned_by_the_environment(timer, monkeypatch):
    monkeypatch.setenv(gemm_choice.ENV, "cublas")
    assert gemm_choice.choose(("k",), candidates([]), torch.device(DEVICE)) == "cublas"
    assert timer["timed"] == [] and gemm_choice.chosen() == {}
    monkeypatch.setenv(gemm_choice.ENV, "cutlass")
    with pytest.raises(ValueError, match="AUTOPREC_DECODED_GEMM='cutlass'"):
        gemm_choice.choose(("k",), candidates([]), torch.device(DEVICE))


def test_sm90_decoded_gemm_choice_untimed_off_a_gpu(monkeypatch):
    """On CPU, in the interpreter (or while a CUDA graph captures), cuBLAS's product runs and nothing is kept."""
    monkeypatch.delenv(gemm_choice.ENV, raising=False)
    monkeypatch.setattr(gemm_choice, "_CHOSEN", {})
    monkeypatch.setattr(gemm_choice, "short_bench", lambda fn: pytest.fail("timed a product off a GPU"))
    assert not gemm_choice.measurable(torch.device("cpu"))
    assert gemm_choice.choose(("k",), candidates([]), torch.device("cpu")) == "cublas"
    assert gemm_choice.chosen() == {}


def test_size_bucket():
    assert [gemm_choice.size_bucket(m) for m in (1, 2, 3, 64, 65, 1000, 8192)] == [1, 2, 4, 64, 128, 1024, 8192]


@pytest.mark.parametrize("fmt,bias", [("nvfp4", False), ("mxfp8", True)], ids=["nvfp4", "mxfp8-bias"])
def test_sm90_decoded_gemm_runs_the_product_it_timed_faster(timer, monkeypatch, fmt, bias):
    """``scaled_mm_decoded`` times both products at a new key, then runs the faster one alone; the result is that
    product's, bit for bit; a new token count in the same power-of-two bucket reuses the choice, as does a
    reduction dim in its bucket (the tokens are wgrad's K)."""
    runs = []
    for name in ("_cublas", "_triton_gemm"):
        fn = getattr(dec, name)
        monkeypatch.setattr(dec, name, lambda *args, fn=fn, name=name, **kw: runs.append(name) or fn(*args, **kw))
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(40, 96, generator=gen), torch.randn(96, 32, generator=gen)  # M, N, K in buckets 64, 32, 128
    b = torch.randn(32, generator=gen).to(DEVICE) if bias else None
    qa, qb = (as_operand(to_device(q, DEVICE), axis, side) for q, axis, side in
              ((quantize_ref(x, fmt, 1), 1, "a"), (quantize_ref(w, fmt, 0), 0, "b")))
    got = dec.scaled_mm_decoded(qa, qb, b, torch.bfloat16)
    assert runs == ["_cublas", "_triton_gemm", "_triton_gemm"]  # timed both, then ran Triton's
    want = dec.scaled_mm_decoded_triton(qa, qb, b, torch.bfloat16)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    runs.clear()
    x2 = torch.randn(60, 96, generator=gen)  # 60 tokens: the same bucket (64) as 40
    dec.scaled_mm_decoded(as_operand(to_device(quantize_ref(x2, fmt, 1), DEVICE), 1, "a"), qb, b, torch.bfloat16)
    assert runs == ["_triton_gemm"] and len(timer["timed"]) == 2
    runs.clear()
    x3, w3 = torch.randn(40, 128, generator=gen), torch.randn(128, 32, generator=gen)  # K 128: the bucket of 96
    qa3, qb3 = quantize_ref(x3, fmt, 1), quantize_ref(w3, fmt, 0)
    dec.scaled_mm_decoded(as_operand(to_device(qa3, DEVICE), 1, "a"), as_operand(to_device(qb3, DEVICE), 0, "b"), b,
                          torch.bfloat16)
    assert runs == ["_triton_gemm"] and len(timer["timed"]) == 2
