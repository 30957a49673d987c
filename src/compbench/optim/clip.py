"""Gradient clipping by the global norm (`optim.clip_grad_norm`), as torch's `clip_grad_norm_`.

The trainer clips right before the optimizer's step, so what it clips is what the step reads: the
averaged gradient in the per-step modes (sync=step, ddp, horovod_optimizer: after the exchange), and
each worker's own gradient on every inner step of sync=diloco (its references clip every inner step).
A gradient the pipeline hands over sparse (a coalesced COO tensor: the averaged sparse payload)
counts by its values and is scaled in place, as the dense gradient it stands for would be.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

CLIP_KEY = "clip_grad_norm"  # the optim setting; null: no clipping


def clip_grad_norm(params: Iterable[Tensor], max_norm: float) -> Tensor:
    """Scale every `.grad` by min(1, max_norm / (norm + 1e-6)), the norm taken over all of them
    together; returns that norm (before clipping) as a 0-dim tensor where the gradients are, so the
    host never waits for it (a caller that wants the number reads it). Dense gradients go through
    torch's `clip_grad_norm_` itself, so the bytes are torch's; sparse ones scale by the same factor
    as a 0-dim tensor, as torch does (its value is the fp32 the host read gave: the same bits)."""
    params = [p for p in params if p.grad is not None]
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    if not any(g.is_sparse for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    norms = [torch.linalg.vector_norm(g.coalesce().values() if g.is_sparse else g) for g in grads]
    total = torch.linalg.vector_norm(torch.stack(norms))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total
