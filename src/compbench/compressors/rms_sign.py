"""`rms_sign`: 1-bit Adam's compression (Tang et al., ICML 2021; reference DeepSpeed
`deepspeed/runtime/comm/nccl.py`, `compressed_allreduce`): the signs packed 8 per byte (bit set =
negative, 0 counts as positive) and one scale, the root mean square ||x||_2 / sqrt(n), decoded as
scale * sign. Biased: it runs with error feedback (memory=residual: the worker error; over comm=ps
the server keeps its own, the reference's two-level error feedback).

A payload can be cut at multiples of 8 elements (`split`): comm=ps then compresses a tensor once (one
scale per tensor and its worker error over the whole tensor, as the reference) and sends each
server its part of the bits with the scale. Ranks combine by the mean of their decodes, accumulated
as the reference does: the sum over ranks, in rank order, of sign_i * (s_i / N).

Deviation: the reference pads every tensor to a multiple of N * lcm(N, 8) elements, and the padding
takes part in the scale and the error feedback; here nothing is padded (comm=ps cuts at multiples
of 8, the last shard may be shorter). On tensors whose size is such a multiple the two agree bit
for bit (tests/unit/test_onebit_adam_sync.py).

Wire: ceil(n/8) + 4 bytes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from compbench.codec.base import ERROR_FEEDBACK_RECIPE, Capabilities, CompressorBase, Ctx, make_ctx
from compbench.codec.packing import decode_bits, pack_bits, packed_nbytes


class RMSSign(CompressorBase):
    name = "rms_sign"
    caps = Capabilities(split_unit=8, recipe=ERROR_FEEDBACK_RECIPE)

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        flat = x.reshape(-1).float()
        scale = (torch.linalg.vector_norm(flat) / math.sqrt(max(flat.numel(), 1))).reshape(1)
        return [pack_bits(flat < 0), scale], make_ctx(x, name)

    def decompress(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        packed, scale = payload
        return decode_bits(packed, ctx.numel, -scale, scale).view(ctx.shape).to(ctx.dtype)

    def decompress_all(self, payloads: list[list[Tensor]], ctx: Ctx) -> Tensor:
        """The mean of every rank's decode: sum of sign_i * (s_i / N), in rank order."""
        average = torch.zeros(ctx.numel, dtype=torch.float32, device=ctx.device)
        for packed, scale in payloads:
            s = scale.to(ctx.device) * (1.0 / len(payloads))
            average.add_(decode_bits(packed.to(ctx.device), ctx.numel, -s, s))
        return average.view(ctx.shape).to(ctx.dtype)

    def split(self, payload: list[Tensor], ctx: Ctx, bounds: list[tuple[int, int]],
              names: list[str]) -> list[tuple[list[Tensor], Ctx]]:
        """The payload of the flat element range [a, b) of the tensor for each of `bounds` (a: a
        multiple of 8, or an empty range), named `names`: its bytes of bits and the tensor's scale."""
        packed, scale = payload
        out = []
        for (a, b), name in zip(bounds, names, strict=True):
            assert a % 8 == 0 or a == b, (a, b)
            part = [packed[a // 8 : a // 8 + packed_nbytes(b - a, 1)], scale]
            out.append((part, Ctx(name=name, shape=torch.Size([b - a]), dtype=ctx.dtype, device=ctx.device)))
        return out

    def wire_bytes(self, numel: int) -> int:
        return packed_nbytes(numel, 1) + 4
