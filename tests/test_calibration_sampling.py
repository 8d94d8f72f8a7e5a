"""Calibration measures each GEMM on a sample of its output rows; the operands are still quantized whole."""
import pytest
import torch

import autoprec
from autoprec.planner import sampling
from autoprec.planner.sampling import Sample, sampled_rows

from gpt_model import TinyGPT, tokens

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_sampled_rows():
    assert sampled_rows(256) is None and sampled_rows(100) is None
    assert sampled_rows(1024) == slice(0, 1024, 4)
    assert len(range(1000)[sampled_rows(1000)]) <= sampling.SAMPLED_ROWS
    # an attention product's 32 x 128 rows: every 16th row of each, 256 in all; a huge batch keeps one each
    assert sampled_rows(128, 32) == slice(0, 128, 16)
    assert range(128)[sampled_rows(128, 4096)] == range(0, 1)


def test_batched_products_are_sampled_by_batch_item_row_and_column():
    """An attention product of 32 (head, sequence) items: 8 of them, 32 rows each, all 128 columns."""
    s = Sample.of(torch.Size((32, 128, 64)), torch.Size((32, 64, 128)))
    assert s == Sample(slice(0, 32, 4), slice(0, 128, 4), None)
    y = torch.arange(32 * 128 * 128).reshape(32, 128, 128)
    assert s.pick(y, 2).shape == (8, 32, 128) and s.pick(y, 2)[1, 1, 0] == y[4, 4, 0]
    assert Sample.of(torch.Size((1024, 64)), torch.Size((64, 512))) == Sample(None, slice(0, 1024, 4), slice(0, 512, 2))


def calibrated_rows(monkeypatch, sampled: int) -> dict:
    monkeypatch.setattr(sampling, "SAMPLED_ROWS", sampled)
    torch.manual_seed(0)
    model = TinyGPT(vocab=64, d=64, layers=1, heads=2, ctx=64)
    compiled = torch.compile(model, backend="autoprec", options={"recipe": "auto"})
    compiled(*tokens(batch=16, ctx=64, vocab=64)).backward()  # 1024 tokens: every 8th row at 128
    plan = autoprec.plan(compiled)
    torch._dynamo.reset()
    return {(d.module, d.role): d for d in plan.decisions}


def test_sampled_scores_track_the_full_measurement(monkeypatch):
    """Errors, biases and loss-aware scores from 1 row in 8 stay close to those from every row."""
    full, sampled = calibrated_rows(monkeypatch, 10**9), calibrated_rows(monkeypatch, 128)
    assert full.keys() == sampled.keys()
    for key, d in full.items():
        s = sampled[key]
        assert s.err == pytest.approx(d.err, rel=0.25), key
        assert abs(s.bias - d.bias) <= 0.25 * abs(d.bias) + 0.1 * d.err ** 0.5, key
        assert (s.loss is None) == (d.loss is None), key
        if d.loss is not None:
            assert s.loss == pytest.approx(d.loss, rel=0.5), key
