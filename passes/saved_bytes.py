"""Analysis pass: bytes the partitioned forward graph saves for backward."""
from __future__ import annotations

import torch
import torch.fx as fx


def _nbytes(val: object) -> int:
    if not isinstance(val, torch.Tensor):
        return 0
    numel = val.numel()
    if not isinstance(numel, int):
        numel = int(numel.node.hint) if getattr(numel.node, "hint", None) is not None else 0
    return numel * val.element_size()


def saved_tensor_bytes(fw_module: fx.GraphModule, num_fwd_outputs: int) -> int:
    """Sum of the sizes of what the forward saves for backward beyond its inputs (activations, and
    quantized codes and scales where a plan quantizes them); inputs and parameters are alive anyway
    and not counted. Symbolic sizes count at their example value."""
    outputs = fw_module.graph.find_nodes(op="output")[0].args[0]
    saved = [n for n in outputs[num_fwd_outputs:] if isinstance(n, fx.Node) and n.op != "placeholder"]
    return sum(_nbytes(n.meta.get("val")) for n in saved)
