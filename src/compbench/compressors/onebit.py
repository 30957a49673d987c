"""`onebit`: 1-bit SGD (Seide et al., 2014): one bit per element, two reconstruction means."""

from __future__ import annotations

import torch
from torch import Tensor

from compbench.codec.base import ERROR_FEEDBACK_RECIPE, Capabilities, Ctx, make_ctx
from compbench.codec.buffers import Scratch
from compbench.codec.packing import PackedCodeCompressor, decode_bits, pack_bits, packed_nbytes
from compbench.kernels import cpu, cpu_kernels_enabled


class OneBit(PackedCodeCompressor):
    """Bit = (x < 0); decode negatives to the mean of the negative elements and the others to the
    mean of the non-negative elements. Biased: use it with error feedback (`memory=residual`),
    as 1-bit SGD was designed.

    On the wire: the bits packed 8 per byte plus the two means as one 2-element fp32 tensor
    [mean of negatives, mean of non-negatives]: ceil(n/8) + 8 bytes.

    MergeComp's OneBit decode inverts a uint8 0/1 mask with bitwise-not, which gives 255/254 rather
    than 1/0; compbench never inverts codes: each packed byte is decoded through a 256-row table.
    """

    name = "onebit"
    caps = Capabilities(recipe=ERROR_FEEDBACK_RECIPE)

    def __init__(self) -> None:
        self._work = Scratch()

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        flat = x.reshape(-1).float()
        if cpu_kernels_enabled(flat):
            packed, means = cpu.onebit_pack(flat)
        else:
            packed, means = _onebit(flat, self._work.like(name, flat))
        return [packed, means], make_ctx(x, name)

    def _decode(self, payload: list[Tensor], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        packed, means = payload
        return decode_bits(packed, ctx.numel, means[0:1], means[1:2], out)

    def wire_bytes(self, numel: int) -> int:
        return packed_nbytes(numel, 1) + 8


def _onebit(flat: Tensor, work: Tensor) -> tuple[Tensor, Tensor]:
    """The hot step: flat fp32 -> (packed sign bits, [mean of negatives, mean of non-negatives]).

    `work` (same size) is overwritten. An empty side gets mean 0 (no element decodes to it).
    The twin of the compiled CPU kernel (`kernels.cpu.onebit_pack`: one read, fp64 sums, so the
    means agree to fp32 rounding).
    """
    neg = flat < 0
    n_neg = torch.count_nonzero(neg).to(flat.dtype)
    n_pos = flat.numel() - n_neg
    # Two clamped sums rather than sum(x) - sum_neg: no cancellation when one side dominates.
    sum_neg = torch.clamp(flat, max=0, out=work).sum()
    sum_pos = torch.clamp(flat, min=0, out=work).sum()
    means = torch.stack([sum_neg / n_neg.clamp_min(1), sum_pos / n_pos.clamp_min(1)])
    return pack_bits(neg), means
