"""`model=gpt`: a small causal transformer in the nanoGPT style, for `dataset=shakespeare` and
`dataset=text`; `model=gpt_10m` and `model=gpt2_small` are the same model in the references' larger
shapes (nanoGPT's shakespeare-char, GPT-2 small).

Pre-norm blocks (LayerNorm -> causal self-attention -> residual, LayerNorm -> GELU MLP of 4x the
width -> residual), learned positions, a final LayerNorm, and the output layer tied to the token
embedding (one weight: one gradient tensor, communicated once). Attention is torch's fused
`F.scaled_dot_product_attention(..., is_causal=True)`. Input: token ids (batch, time); output:
logits (batch, time, vocab_size). Initialization as GPT-2: normal(0, 0.02), residual projections
scaled by 1/sqrt(2 n_layer).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    """Multi-head causal self-attention (one fused qkv projection)."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = SelfAttention(n_embd, n_head, dropout)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + position embeddings, `n_layer` blocks, final LayerNorm, tied output layer."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_embd: int, n_head: int,
                 dropout: float) -> None:
        super().__init__()
        self.block_size = block_size
        self.tok = nn.Embedding(vocab_size, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*(Block(n_embd, n_head, dropout) for _ in range(n_layer)))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied: one parameter (named tok.weight)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.block_size:
            raise ValueError(f"model=gpt: a sequence of {t} tokens is longer than model.block_size="
                             f"{self.block_size}")
        x = self.drop(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))
        return self.head(self.ln_f(self.blocks(x)))


def gpt(vocab_size: int, block_size: int = 128, n_layer: int = 4, n_embd: int = 128, n_head: int = 4,
        dropout: float = 0.0) -> nn.Module:
    for key, value in (("vocab_size", vocab_size), ("block_size", block_size), ("n_layer", n_layer),
                       ("n_embd", n_embd), ("n_head", n_head)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"model.{key}={value} must be an integer >= 1")
    if n_embd % n_head:
        raise ValueError(f"model.n_embd={n_embd} must be a multiple of model.n_head={n_head}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"model.dropout={dropout} must be in [0, 1)")
    return GPT(vocab_size, block_size, n_layer, n_embd, n_head, dropout)


def gpt_10m(vocab_size: int, block_size: int = 256, n_layer: int = 6, n_embd: int = 384, n_head: int = 6,
            dropout: float = 0.0) -> nn.Module:
    """`model=gpt_10m`: nanoGPT's shakespeare-char shape (10.8M parameters at 65 tokens, 256 positions)."""
    return gpt(vocab_size, block_size, n_layer, n_embd, n_head, dropout)


def gpt2_small(vocab_size: int, block_size: int = 1024, n_layer: int = 12, n_embd: int = 768,
               n_head: int = 12, dropout: float = 0.0) -> nn.Module:
    """`model=gpt2_small`: GPT-2 small's shape (124M parameters at its 50257 tokens and 1024 positions)."""
    return gpt(vocab_size, block_size, n_layer, n_embd, n_head, dropout)


def gpt_1b(vocab_size: int, block_size: int = 64, n_layer: int = 20, n_embd: int = 2048, n_head: int = 16,
           dropout: float = 0.0) -> nn.Module:
    """`model=gpt_1b`: 1.0B parameters (20 layers of width 2048): with AdamW, 16 GB per unsharded
    worker (parameters, gradients, two moments in fp32), what two DDP workers cannot hold in 24 GiB
    and two FSDP workers can (8 GB each)."""
    return gpt(vocab_size, block_size, n_layer, n_embd, n_head, dropout)
