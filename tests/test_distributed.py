"""Two CPU ranks (gloo) train with recipe auto on different data: calibration is merged across ranks,
so both run the identical plan and end with identical parameters, under DDP and FSDP2."""
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from dist_worker import worker

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MODES = ["ddp", "fsdp", "fsdp_blocks", "fsdp_regional", "ddp_moe", "fsdp_rl_sampler"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Every mode's run, by one pair of rank processes (started once: a start costs more than a run)."""
    out = tmp_path_factory.mktemp("ranks")
    mp.spawn(worker, args=(2, free_port(), MODES, str(out)), nprocs=2)
    return out


@pytest.fixture
def run(runs):
    """The two ranks' saved results of a mode."""
    return lambda mode: (torch.load(runs / f"{mode}0.pt"), torch.load(runs / f"{mode}1.pt"))


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_ranks_run_one_plan(mode, run):
    a, b = run(mode)
    assert len(a["rows"]) == 39 and a["rows"] == b["rows"]  # the merged measurements, bit for bit
    assert {r[1] for r in a["rows"]} >= {"nvfp4"}
    assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))
    prefix = "module." if mode == "ddp" else ""
    assert (f"{prefix}lm_head", "fprop", 0) in [r[0] for r in a["rows"]]  # the root frame is compiled
    assert a["eager"] == []


def test_fsdp_per_block_sharding(run):
    """FSDP2 hooks on every block make dynamo skip the root frame: the blocks are planned (found by module
    path while their parameters are unsharded), and the plan names the root's modules as eager, with why."""
    a, b = run("fsdp_blocks")
    assert a["rows"] == b["rows"] and len(a["rows"]) == 36
    assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))
    assert a["eager"] == ["wte", "wpe", "lm_head"] and any("frame skipped" in n for n in a["notes"])


def test_fsdp_sharded_blocks_compiled_on_their_own_share_one_plan(run):
    """torchtitan's setup: each block compiled alone, then sharded, the model sharded, nothing else compiled.
    The ranks merge every block's measurements into one plan of the model, named from it."""
    a, b = run("fsdp_regional")
    assert a["rows"] == b["rows"] and len(a["rows"]) == 36
    assert {r[0][0] for r in a["rows"]} >= {"blocks.0.attn.qkv", "blocks.1.mlp.fc2"}
    assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))
    assert a["eager"] == ["wte", "wpe", "lm_head"] and any("regional compilation" in n for n in a["notes"])


def test_moe_ranks_share_token_counts(run):
    """Each rank routes its own tokens: the per-expert counts the cost model uses are merged like the
    scores, so both ranks cost, solve and run the same plan."""
    a, b = run("ddp_moe")
    assert a["rows"] == b["rows"] and all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))
    tokens = [r[6] for r in a["rows"] if r[6] is not None]
    assert tokens and all(sum(t) == 2 * 64 for t in tokens)  # 4 x 16 tokens, top-2, averaged over the ranks


def test_fsdp_sampler_weights_are_never_served_stale(run):
    """An RL sampler sharded by FSDP2: after its sharded weights are written, every call equals a call with every
    weight prepared anew (the all-gather's write into the unsharded parameters is seen)."""
    for result in run("fsdp_rl_sampler"):
        assert result["fresh"] == [True, True] and result["changed"] == [True, True] and result["cached"] > 0
