"""`fp16`: cast to half precision (or bfloat16) on the wire: 2n bytes."""

from __future__ import annotations

import torch
from torch import Tensor

from compbench.compressors.base import CompressorBase, Ctx, make_ctx

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


class FP16(CompressorBase):
    """Half-precision cast. `dtype=bfloat16` keeps fp32's range at a coarser mantissa."""

    name = "fp16"
    summable = True

    def __init__(self, dtype: str = "float16") -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"compressor=fp16: dtype={dtype} is not supported; use float16 or bfloat16")
        self.wire_dtype = _DTYPES[dtype]

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        return [x.reshape(-1).to(self.wire_dtype)], make_ctx(x, name)

    def decompress(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        return payload[0].to(ctx.dtype).view(ctx.shape)

    def wire_bytes(self, numel: int) -> int:
        return 2 * numel
