"""`fp16`: cast to half precision (or bfloat16) on the wire: 2n bytes."""

from __future__ import annotations

import torch
from torch import Tensor

from compbench.codec.base import Capabilities, CompressorBase, Ctx, make_ctx
from compbench.codec.buffers import acc_dtype, check_out
from compbench.codec.packing import scratch

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


class FP16(CompressorBase):
    """Half-precision cast. `dtype=bfloat16` keeps fp32's range at a coarser mantissa."""

    name = "fp16"
    caps = Capabilities(summable=True, decodes_into=True)

    def __init__(self, dtype: str = "float16") -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"compressor=fp16: dtype={dtype} is not supported; use float16 or bfloat16")
        self.wire_dtype = _DTYPES[dtype]

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        # The payload must be a fresh tensor (it is in flight while the caller goes on): its page
        # faults are the cost of a cast at n = 25M unless torch backs it with huge pages
        # (THP_MEM_ALLOC_ENABLE=1, which `compbench bench` records).
        return [x.detach().reshape(-1).to(self.wire_dtype)], make_ctx(x, name)

    def decompress(self, payload: list[Tensor], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        """The cast back; into `out` when given (see `codec/buffers.py`)."""
        if out is None:
            return payload[0].to(ctx.dtype).view(ctx.shape)
        res = check_out(out, ctx, payload[0].device).copy_(payload[0])
        return res.view(ctx.shape) if res.dtype == ctx.dtype else res.to(ctx.dtype).view(ctx.shape)

    def decompress_all(self, payloads: list[list[Tensor]], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        """Mean of every rank's decode, accumulated in one fp32 buffer (not an N x n stack)."""
        acc = acc_dtype(ctx.dtype)
        device = payloads[0][0].device
        if out is None:
            total = torch.empty(ctx.numel, dtype=acc, device=device)
        else:
            total = check_out(out, ctx, device)
        total.copy_(payloads[0][0])
        if len(payloads) > 1:
            # A cast into scratch, then a same-dtype add: torch's mixed-dtype add_ is several x slower.
            peer = scratch(ctx.numel, acc, device)
            for payload in payloads[1:]:
                total.add_(peer.copy_(payload[0]))
        total.div_(len(payloads))
        return total.view(ctx.shape) if acc == ctx.dtype else total.to(ctx.dtype).view(ctx.shape)

    def wire_bytes(self, numel: int) -> int:
        return 2 * numel
