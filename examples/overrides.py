"""Override autoprec's choices: annotate modules, add glob rules, save the plan, edit it, reload it.

    OMP_NUM_THREADS=1 python examples/overrides.py
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

import autoprec

from gpt_model import TinyGPT, tokens


def step(compiled, idx, tgt) -> float:
    loss = compiled(idx, tgt)
    loss.backward()
    return loss.item()


def main() -> None:
    torch.manual_seed(0)
    model = TinyGPT(vocab=64, d=64, layers=2, heads=2, ctx=32)
    idx, tgt = tokens(batch=8, ctx=32, vocab=64)
    autoprec.annotate(model.lm_head, "bf16")  # every role of the head in BF16
    autoprec.annotate(model.blocks[0].mlp.fc1, fprop="mxfp8", wgrad="bf16")
    rules = {"blocks.*.attn.*": {"dgrad": "mxfp8"}}
    compiled = torch.compile(model, backend="autoprec", options={"overrides": rules})
    for _ in range(2):
        step(compiled, idx, tgt)
    plan = autoprec.plan(compiled)
    for d in plan.decisions:
        if d.reason.startswith("override"):
            print(f"{d.module:<20} {d.role!s:<6} {d.fmt:<6} {d.reason}")

    path = Path(tempfile.mkdtemp()) / "plan.json"
    plan.save(path)
    data = json.loads(path.read_text())
    for d in data["decisions"]:
        if d["module"] == "blocks.1.mlp.fc2":
            d["fmt"], d["reason"] = "mxfp8", "edited in plan.json"
    path.write_text(json.dumps(data, indent=1))
    torch._dynamo.reset()
    reloaded = torch.compile(model, backend="autoprec", options={"plan": str(path)})
    step(reloaded, idx, tgt)  # no calibration: the file is the plan
    for d in autoprec.plan(reloaded).decisions:
        if d.module == "blocks.1.mlp.fc2":
            print(f"{d.module:<20} {d.role!s:<6} {d.fmt:<6} {d.reason}")


if __name__ == "__main__":
    main()
