"""A 2-rank training run on CPU (gloo) for the distributed tests: DDP (of the GPT, or of its MoE variant)
or FSDP2 (of the model, of each block too, or of each block compiled on its own as torchtitan does), recipe
auto, each rank on its own data. Each rank saves its plan rows, its plan's eager list
and its final parameters. One pair of processes runs every mode asked for, one after the other (dynamo reset
between them): a process's start and first compile cost more than a mode's run."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from gpt_model import TinyGPT, tokens


def worker(rank: int, world: int, port: int, modes: list[str], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for mode in modes:
        torch._dynamo.reset()
        train(rank, mode, out)
    dist.destroy_process_group()


def train(rank: int, mode: str, out: str) -> None:
    """Three steps of ``mode``; saves this rank's plan rows, eager list, notes and parameters."""
    import autoprec

    if mode == "fsdp_rl_sampler":
        return sample_after_updates(rank, out)

    torch.manual_seed(0)
    model = TinyGPT(vocab=64, d=64, layers=2, heads=2, ctx=16, experts=4 if mode == "ddp_moe" else 0)
    if mode.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        if mode == "fsdp_regional":  # torchtitan: each block compiled, then sharded; the model sharded
            for i, block in enumerate(model.blocks):
                model.blocks.register_module(str(i), torch.compile(block, backend="autoprec"))
        if mode in ("fsdp_blocks", "fsdp_regional"):
            for block in model.blocks:
                fully_shard(block)
        wrapped = fully_shard(model)
    compiled = wrapped if mode == "fsdp_regional" else torch.compile(wrapped, backend="autoprec")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        compiled(*tokens(batch=4, ctx=16, vocab=64, seed=10 * rank + step)).backward()
        opt.step()
    plan = autoprec.plan(compiled)
    params = [p.full_tensor() if hasattr(p, "full_tensor") else p.detach() for p in model.parameters()]
    rows = [(d.key, d.fmt, d.rounding, d.rht, d.tile2d, d.err, d.group_tokens) for d in plan.decisions]
    torch.save({"rows": rows, "params": params, "eager": plan.not_compiled, "notes": plan.notes},
               f"{out}/{mode}{rank}.pt")


def sample_after_updates(rank: int, out: str) -> None:
    """An FSDP2-sharded RL sampler whose weights are written between calls (the sharded parameters, as an
    optimizer step writes them; the unsharded ones are all-gathered anew at each forward): saves, per call after a
    write, whether its output equals a call with every weight prepared anew, and whether the write changed it."""
    from torch.distributed.fsdp import fully_shard

    import autoprec

    torch.manual_seed(0)
    model = TinyGPT(vocab=64, d=64, layers=2, heads=2, ctx=16)
    compiled = torch.compile(fully_shard(model), backend="autoprec", options={"phase": "rl_sampler", "recipe": "nvfp4"})
    idx, _ = tokens(batch=4, ctx=16, vocab=64, seed=rank)
    fresh, changed = [], []
    with torch.no_grad():
        compiled(idx)  # calibrates
        last = compiled(idx)
        for _ in range(2):
            for m in model.blocks.modules():
                if isinstance(m, torch.nn.Linear):
                    m.weight.mul_(1.1)
            got = compiled(idx)
            autoprec.refresh_weights()
            fresh.append(torch.equal(got, compiled(idx)))
            changed.append(not torch.equal(got, last))
            last = got
    from autoprec.kernels import weight_cache

    torch.save({"fresh": fresh, "changed": changed, "cached": weight_cache.cached_count()},
               f"{out}/fsdp_rl_sampler{rank}.pt")
