"""A Llama-style model (RMSNorm, SwiGLU MLP, rotary position embeddings, untied head) for the quality
benchmark: the second model family beside the nanoGPT of gpt_model.py."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt_model import lm_loss, nanogpt_init


def swiglu_hidden(d: int, multiple: int = 32) -> int:
    """Llama's MLP width, 8d/3 rounded up to ``multiple`` (so every reduction dim takes whole MXFP8 blocks)."""
    return -(-8 * d // 3 // multiple) * multiple


def rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary embeddings on (batch, heads, time, head_dim), pairing the two halves of the head dim."""
    t, half = x.shape[-2], x.shape[-1] // 2
    freqs = base ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    angles = torch.arange(t, dtype=torch.float32, device=x.device)[:, None] * freqs
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = nn.RMSNorm(d), nn.RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        h = swiglu_hidden(d)
        self.gate, self.up = nn.Linear(d, h, bias=False), nn.Linear(d, h, bias=False)
        self.down = nn.Linear(h, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        y = self.attn_norm(x)
        q, k, v = (p(y).view(b, t, self.heads, d // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        att = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, t, d))
        y = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class TinyLlama(nn.Module):
    """Embedding, ``layers`` Llama blocks, a final RMSNorm and an untied head; returns the mean
    cross-entropy against ``targets`` (the logits when there are none)."""

    def __init__(self, vocab: int = 64, d: int = 32, layers: int = 2, heads: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(LlamaBlock(d, heads) for _ in range(layers))
        self.norm = nn.RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        nanogpt_init(self)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return lm_loss(self.lm_head(self.norm(x)), targets)
