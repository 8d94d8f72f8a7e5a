"""A nanoGPT-style GPT (and an MLP) used by the examples, benchmarks and tests.

Options cover what the compiler must handle: explicit or fused (SDPA) attention, a graph break
inside each block, a lm_head tied to the token embedding, and mixture-of-experts MLPs.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d: int = 32, h: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MoE(nn.Module):
    """A mixture-of-experts MLP: top-k routing, tokens sorted by expert, and the experts (3D parameters)
    run as grouped GEMMs (``F.grouped_mm`` in bf16, as its CPU kernel needs; torchtitan-style)."""

    def __init__(self, d: int, h: int, experts: int, top_k: int = 2) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(d, experts, bias=False)
        self.w_in = nn.Parameter(torch.randn(experts, d, h) * d ** -0.5)
        self.w_out = nn.Parameter(torch.randn(experts, h, d) * h ** -0.5)

    @staticmethod
    def grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return F.grouped_mm(x.bfloat16(), w.bfloat16(), offs=offs).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self.router(flat).softmax(-1).topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        expert = chosen.reshape(-1)
        order = torch.argsort(expert, stable=True)
        token = order // self.top_k
        offs = F.one_hot(expert, self.w_in.shape[0]).sum(0).cumsum(0).to(torch.int32)  # static shape: no graph break
        y = self.grouped(F.gelu(self.grouped(flat[token], self.w_in, offs)), self.w_out, offs)
        y = y * weights.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(flat).index_add(0, token, y).view_as(x)


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, sdpa: bool) -> None:
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, sdpa: bool, graph_break: bool = False, experts: int = 0) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, sdpa)
        self.mlp = MoE(d, 2 * d, experts) if experts else MLP(d, 4 * d)
        self.graph_break = graph_break

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        if self.graph_break:
            torch._dynamo.graph_break()
        return x + self.mlp(self.ln2(x))


def nanogpt_init(model: nn.Module) -> None:
    """nanoGPT's initialisation: N(0, 0.02) weights for linear and embedding layers, zero biases."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
    """The mean cross-entropy of (batch, time, vocab) logits against ``targets``, or the logits without them."""
    if targets is None:
        return logits
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class TinyGPT(nn.Module):
    """A nanoGPT-style model with a lm_head tied to the token embedding; ``experts`` > 0 replaces each
    block's MLP by a top-2 mixture of that many experts of hidden size 2d (the same active FLOPs)."""

    def __init__(self, vocab: int = 64, d: int = 32, layers: int = 2, heads: int = 2, ctx: int = 16,
                 sdpa: bool = False, graph_break: bool = False, experts: int = 0) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads, sdpa, graph_break, experts) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        nanogpt_init(self)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """The mean cross-entropy against ``targets``, or the logits when there are none."""
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return lm_loss(self.lm_head(self.ln_f(x)), targets)


def tokens(batch: int = 2, ctx: int = 16, vocab: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (batch, ctx + 1), generator=gen)
    return idx[:, :-1], idx[:, 1:]
