"""Decode into a reusable buffer: no fresh 100 MB tensor per call.

At n = 25M a fresh fp32 tensor costs 30-40 ms of page faults on first touch (6 ms with torch's
`THP_MEM_ALLOC_ENABLE=1`) against 3 ms to zero-fill a warm one, more than the decode itself. The
compressors whose decode is dense and hot (the sparsifiers, fp16) take `out=`: a flat, contiguous
tensor of ctx.numel elements of the accumulation dtype (fp32 for fp32/fp16/bf16 gradients) that
they overwrite and return (reshaped to ctx.shape when no dtype cast is needed).

Aliasing rule: a result decoded into `out` IS `out` (a view of it): it stays valid until the caller
passes the same buffer again. `OutputBuffers` keeps one buffer per tensor name for callers that
consume each decode before decoding the same name again (comm -> `p.grad.copy_(averaged)`, the
benchmark). Without `out` every decode returns a fresh tensor, as before.
"""

from __future__ import annotations

import torch
from torch import Tensor

from compbench.codec.base import Ctx


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision gradients are accumulated in fp32 so that N ranks' sums do not lose bits."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def check_out(out: Tensor, ctx: Ctx, device: torch.device | str | None = None) -> Tensor:
    """`out` as a flat view, after checking it can hold the decode of `ctx` (ValueError otherwise)."""
    acc = acc_dtype(ctx.dtype)
    if (
        out.numel() != ctx.numel
        or out.dtype != acc
        or not out.is_contiguous()
        or (device is not None and out.device != torch.device(device))
    ):
        raise ValueError(
            f"decode buffer for {ctx.name} must be a contiguous {acc} tensor of {ctx.numel} elements"
            f"{'' if device is None else f' on {device}'}, got {out.dtype} {tuple(out.shape)} on {out.device}"
        )
    return out.view(-1)


class OutputBuffers:
    """One decode buffer per tensor name (sized and typed by the Ctx), for `decompress(..., out=)`.

    The caller owns `get(ctx)`'s tensor until its next `get` for the same name (see the module's
    aliasing rule)."""

    def __init__(self) -> None:
        self._bufs: dict[str, Tensor] = {}

    def get(self, ctx: Ctx) -> Tensor:
        acc = acc_dtype(ctx.dtype)
        buf = self._bufs.get(ctx.name)
        if buf is None or buf.numel() != ctx.numel or buf.dtype != acc or buf.device != ctx.device:
            buf = self._bufs[ctx.name] = torch.empty(ctx.numel, dtype=acc, device=ctx.device)
        return buf

    def clear(self) -> None:
        self._bufs.clear()


class Scratch:
    """One reusable work tensor per tensor name, shaped like the tensor being encoded.

    Encoders that need a full-size temporary (noise, magnitudes) keep it here instead of
    allocating 100 MB per call; the contents are garbage until the caller fills them."""

    def __init__(self) -> None:
        self._bufs: dict[str, Tensor] = {}

    def like(self, name: str, t: Tensor) -> Tensor:
        buf = self._bufs.get(name)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype or buf.device != t.device:
            buf = self._bufs[name] = torch.empty_like(t)
        return buf
