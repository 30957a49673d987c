"""`none`: identity (fp32 on the wire), the baseline every other compressor is measured against."""

from __future__ import annotations

from torch import Tensor

from compbench.compressors.base import Capabilities, CompressorBase, Ctx, make_ctx


class NoCompression(CompressorBase):
    """Sends the fp32 tensor as is: 4n bytes."""

    name = "none"
    caps = Capabilities(summable=True, unbiased=True, lossless=True)

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        return [x.reshape(-1)], make_ctx(x, name)

    def decompress(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        return payload[0].view(ctx.shape).to(ctx.dtype)

    def wire_bytes(self, numel: int) -> int:
        return 4 * numel
