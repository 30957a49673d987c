"""`none`: identity (fp32 on the wire), the baseline every other compressor is measured against."""

from __future__ import annotations

import torch
from torch import Tensor

from compbench.codec.base import Capabilities, CompressorBase, Ctx, make_ctx
from compbench.codec.buffers import acc_dtype, check_out


class NoCompression(CompressorBase):
    """Sends the fp32 tensor as is: 4n bytes."""

    name = "none"
    caps = Capabilities(summable=True, unbiased=True, lossless=True, identity=True, decodes_into=True)

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        return [x.reshape(-1)], make_ctx(x, name)

    def decompress(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        return payload[0].view(ctx.shape).to(ctx.dtype)

    def decompress_all(self, payloads: list[list[Tensor]], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        """Mean of the payloads summed in rank order into one buffer: the base class's N x n stack
        costs an allocation and a copy of every payload (a 2-payload decode at 25M took ~15 read passes)."""
        device = payloads[0][0].device
        if out is None:
            total = torch.empty(ctx.numel, dtype=acc_dtype(ctx.dtype), device=device)
        else:
            total = check_out(out, ctx, device)
        total.copy_(payloads[0][0])
        for payload in payloads[1:]:
            total.add_(payload[0])
        total.div_(len(payloads))
        return total.view(ctx.shape) if total.dtype == ctx.dtype else total.to(ctx.dtype).view(ctx.shape)

    def wire_bytes(self, numel: int) -> int:
        return 4 * numel
