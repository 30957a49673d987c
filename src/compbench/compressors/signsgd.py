"""`signsgd`: scaled sign compression, one bit per element plus the mean magnitude."""

from __future__ import annotations

from torch import Tensor

from compbench.codec.base import ERROR_FEEDBACK_RECIPE, Capabilities, CompressorBase, Ctx, make_ctx
from compbench.codec.buffers import check_out
from compbench.codec.packing import average_decoded, decode_bits, pack_signs, packed_nbytes


class SignSGD(CompressorBase):
    """Send sign(x) as packed bits (bit set = negative; zero counts as positive) and the scale
    mean(|x|) = ||x||_1 / n, decoded as scale * sign(x) (Bernstein et al. 2018; the l1 scale of
    Karimireddy et al. 2019). Biased; see `efsignsgd` for the error-feedback variant.

    On the wire: ceil(n/8) bytes of bits + one fp32 scale. GRACE and MergeComp send one byte per
    sign in some paths; compbench packs 8 per byte.
    """

    name = "signsgd"
    caps = Capabilities(decodes_into=True, recipe=ERROR_FEEDBACK_RECIPE)

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        packed, scale = _sign_scale(x.reshape(-1).float())
        return [packed, scale], make_ctx(x, name)

    def decompress(self, payload: list[Tensor], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        """scale * sign; into `out` when given (see `codec/buffers.py`)."""
        if out is not None:
            out = check_out(out, ctx, payload[0].device)
        return self._decode(payload, ctx, out).view(ctx.shape).to(ctx.dtype)

    def decompress_all(self, payloads: list[list[Tensor]], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        """Mean of every rank's decode; into `out` when given."""
        return average_decoded(self._decode, payloads, ctx, out)

    def _decode(self, payload: list[Tensor], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        packed, scale = payload
        return decode_bits(packed, ctx.numel, -scale, scale, out)

    def wire_bytes(self, numel: int) -> int:
        return packed_nbytes(numel, 1) + 4


def _sign_scale(flat: Tensor) -> tuple[Tensor, Tensor]:
    """The hot step: flat fp32 -> (packed sign bits, mean |x| as a 1-element tensor), one pass on CPU
    (`packing.pack_signs`)."""
    packed, total = pack_signs(flat.contiguous())
    return packed, total.div_(max(flat.numel(), 1))
