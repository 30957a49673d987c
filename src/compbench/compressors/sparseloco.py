"""`sparseloco`: SparseLoCo's compressor (Sarfi et al., 2025): chunked top-k, 2-bit values, and its
aggregation, the mean over the workers that sent a coordinate after clipping to the median norm.

Followed: tplr-ai/templar, main branch (c2397ac), `src/tplr/compress.py` (`ChunkingTransformer`,
`TopKCompressor`) with `hparams/hparams.json` (`use_dct: false`, `target_chunk: 64`,
`topk_compression: 64`, `quantization_bins: 4`, `quantization_range: 6`) and `src/tplr/neurons.py`
(`prepare_gradient_dict`, `outer_step`). No DCT: SparseLoCo top-k's the raw error accumulator.

Chunks (the reference's `ChunkingTransformer.encode` without DCT): a matrix of R x C is cut into
blocks of h x w, h the largest divisor of R that is <= `chunk` (R itself when R <= chunk), w the
same for C: a 4096 x 4096 weight gives 64 x 64 blocks. A vector of n is cut into runs of w (n = 1 x
n). Tensors of more than 2 dimensions (the reference has none) are read as shape[0] x the rest, as
`view(shape[0], -1)` does (a conv weight: output channels x fan-in).

Top-k per chunk: the k of largest magnitude, k = ceil(ratio * chunk elements) clamped as the
reference's `_clamp_topk` (at most the chunk, at least 2, made even by dropping one), and at most the
chunk once more (a chunk of 1 element, where the reference's torch.topk would fail, sends it).
ratio = 1/64 is the reference's 64 of a 64 x 64 block. Unlike the reference, whose k is 64 for every
chunk, k follows the chunk size: the reference sends a vector's 64-element runs whole, here at the
ratio (send 1-D tensors dense with `min_dims: 2` to match).

Values, per tensor, 2 bits (the reference's `_quantize_values` with 4 bins): shift = mean(v),
scale = quantization_range * std / 4 (std with n - 1; 1 when it is 0 or not finite), code =
clamp(round(c / scale + 2), 0, 3) of c = v - shift (round half to even, as torch.round), and the
decode table holds each bin's mean of c (0 for an empty bin) plus shift: code -> table[code].

Wire, exact (`payload_bytes(shape)`): [within-chunk indices, ceil(log2(chunk elements)) bits each
(12 for a 64 x 64 chunk, as the reference's 12-bit packing), packed; 2-bit codes packed 4 a byte;
the 4-entry fp32 table]: ceil(K b / 8) + ceil(K / 4) + 16 bytes for K = chunks x k. The chunk layout
follows the shape, so `wire_bytes(numel)` is None and `max_wire_bytes(numel)` bounds every shape.

Aggregation (`decompress_all`, the reference's `batch_decompress` with `clip_norm=True` as
`outer_step` calls it): every worker's decoded values v_i (the whole tensor's sent values) are
scaled by min(1, median_j ||v_j||_2 / (||v_i||_2 + 1e-8)), the lower median for an even count
(torch.median), and each coordinate takes the mean over the workers that sent it (scatter_reduce
"mean" without the zeros); coordinates no one sent are 0. The error accumulator (memory=residual)
takes away the worker's own unclipped decode, as the reference's `prepare_gradient_dict`.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import Tensor

from compbench.codec.base import (
    ERROR_FEEDBACK_RECIPE,
    Capabilities,
    CompressorBase,
    Ctx,
    check_ratio,
    make_ctx,
    num_selected,
)
from compbench.codec.packing import (
    ceil_log2,
    decode_2bit,
    pack_2bit,
    pack_bits,
    packed_nbytes,
    unpack_2bit,
    unpack_bits,
)
from compbench.compressors.sparse import decode_buffer, scatter_add

BINS = 4  # 2-bit codes
TABLE_BYTES = 4 * BINS  # the fp32 decode table
CLIP_EPS = 1e-8  # the reference's clip_factor = median / (norm + 1e-8)


def chunk_side(n: int, target: int) -> int:
    """The largest divisor of n that is <= target; n itself when n <= target (the reference's
    `_get_smaller_split`)."""
    if n <= target:
        return n
    return next(d for d in range(target, 0, -1) if n % d == 0)


def matrix_of(shape: torch.Size | tuple[int, ...]) -> tuple[int, int]:
    """(rows, cols) the chunking reads a tensor as: a vector (or scalar) is 1 x n, a matrix itself,
    more dimensions shape[0] x the rest."""
    n = math.prod(shape)
    if len(shape) < 2:
        return 1, n
    return shape[0], (n // shape[0] if shape[0] else 0)


class Layout:
    """The chunks of one shape: blocks of h x w over a rows x cols matrix, k sent per block."""

    def __init__(self, shape: torch.Size | tuple[int, ...], chunk: int, ratio: float) -> None:
        self.rows, self.cols = matrix_of(shape)
        self.h, self.w = chunk_side(self.rows, chunk), chunk_side(self.cols, chunk)
        self.size = self.h * self.w  # elements per chunk
        self.by = self.rows // self.h if self.h else 0
        self.bx = self.cols // self.w if self.w else 0
        self.chunks = self.by * self.bx
        self.k = chunk_k(self.size, ratio)
        self.bits = ceil_log2(self.size) if self.size else 0  # bits of a within-chunk index
        self.sent = self.chunks * self.k

    def blocks(self, flat: Tensor) -> Tensor:
        """(chunks, size): chunk (iy, ix) at row iy * bx + ix, its elements row-major."""
        return flat.view(self.by, self.h, self.bx, self.w).permute(0, 2, 1, 3).reshape(self.chunks, self.size)

    def flat_indices(self, local: Tensor) -> Tensor:
        """Flat indices into the tensor of the within-chunk indices `local` (k per chunk, chunk-major)."""
        chunk = torch.arange(self.chunks, device=local.device).repeat_interleave(self.k)
        row = (chunk // self.bx) * self.h + local // self.w
        col = (chunk % self.bx) * self.w + local % self.w
        return row * self.cols + col

    def nbytes(self) -> int:
        return packed_nbytes(self.sent, self.bits) + packed_nbytes(self.sent, 2) + TABLE_BYTES


def chunk_k(size: int, ratio: float) -> int:
    """k of a chunk of `size` elements: ceil(ratio * size), clamped as the reference (at most size,
    at least 2, even), then at most size (a 1-element chunk sends its element)."""
    if size == 0:
        return 0
    k = max(min(num_selected(size, ratio), size), 2)
    return min(k - k % 2, size)


def quantize(vals: Tensor, quantization_range: float) -> tuple[Tensor, Tensor]:
    """(uint8 codes in 0..3, 4-entry fp32 decode table) of fp32 values, per tensor (see the module)."""
    if vals.numel() == 0:
        return vals.new_zeros(0, dtype=torch.uint8), vals.new_zeros(BINS)
    shift = vals.mean()
    centered = vals - shift
    std = centered.norm() / math.sqrt(vals.numel() - 1) if vals.numel() > 1 else centered.new_zeros(())
    scale = quantization_range * std / BINS
    # 1 where the spread is zero or not finite, decided on the device (no host synchronization)
    scale = torch.where(torch.isfinite(scale) & (scale != 0), scale, torch.ones_like(scale))
    codes = (centered / scale + BINS // 2).round_().clamp_(0, BINS - 1).to(torch.uint8)
    sums = torch.zeros(BINS, dtype=torch.float32, device=vals.device).index_add_(0, codes.long(), centered)
    counts = torch.bincount(codes.long(), minlength=BINS).to(torch.float32)
    lookup = torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))
    return codes, lookup + shift


def pack_indices(local: Tensor, bits: int) -> Tensor:
    """Within-chunk indices (< 2**bits) as a little-endian stream of `bits` bits each."""
    if bits == 0:
        return torch.zeros(0, dtype=torch.uint8, device=local.device)
    shifts = torch.arange(bits, device=local.device)
    return pack_bits(((local.reshape(-1, 1) >> shifts) & 1).to(torch.bool).reshape(-1))


def unpack_indices(packed: Tensor, count: int, bits: int) -> Tensor:
    """Inverse of `pack_indices`: `count` int64 indices."""
    if bits == 0:
        return torch.zeros(count, dtype=torch.int64, device=packed.device)
    planes = unpack_bits(packed, count * bits).view(count, bits).to(torch.int64)
    return (planes << torch.arange(bits, device=packed.device)).sum(1)


@lru_cache(maxsize=4096)
def _max_bytes(numel: int, chunk: int, ratio: float) -> int:
    # Every chunk size of every shape of `numel` elements is a divisor of numel (h | rows, w | cols)
    # of at most chunk**2 elements (found in pairs up to sqrt(numel)): the largest payload over those
    # divisors bounds them all.
    if numel == 0:
        return TABLE_BYTES
    best = 0
    pairs = ((d, numel // d) for d in range(1, math.isqrt(numel) + 1) if numel % d == 0)
    for size in {s for pair in pairs for s in pair if s <= chunk * chunk}:
        sent = numel // size * chunk_k(size, ratio)
        best = max(best, packed_nbytes(sent, ceil_log2(size)) + packed_nbytes(sent, 2) + TABLE_BYTES)
    return best


class SparseLoCo(CompressorBase):
    """SparseLoCo's chunked top-k with 2-bit values; ranks combine by the clipped mean over senders.

    Biased: pair with memory=residual (SparseLoCo's error accumulator: beta=0.95, gamma=outer lr).
    See the module docstring for the reference followed, the chunks, the codes and the wire.
    """

    name = "sparseloco"
    caps = Capabilities(sparse=True, decodes_into=True, combine="sender_mean", shape_layout=True,
                        recipe=ERROR_FEEDBACK_RECIPE,
                        why_not_summable="sends rank-dependent indices and combines by a clipped mean over "
                                         "the ranks that sent each coordinate")

    def __init__(self, ratio: float = 1 / 64, chunk: int = 64, quantization_range: float = 6.0) -> None:
        self.ratio = check_ratio(ratio, "compressor=sparseloco")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"compressor=sparseloco: chunk={chunk} must be an integer >= 1; "
                             "pass e.g. chunk=64")
        number = isinstance(quantization_range, int | float) and not isinstance(quantization_range, bool)
        if not number or not quantization_range > 0:
            raise ValueError(f"compressor=sparseloco: quantization_range={quantization_range} must be a "
                             "number > 0 (standard deviations); pass e.g. quantization_range=6")
        self.chunk = chunk
        self.quantization_range = float(quantization_range)

    def layout(self, shape: torch.Size | tuple[int, ...]) -> Layout:
        return Layout(tuple(shape), self.chunk, self.ratio)

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        lay = self.layout(x.shape)
        flat = x.detach().reshape(-1).float()
        if lay.sent == 0:
            local = torch.zeros(0, dtype=torch.int64, device=x.device)
            vals = flat.new_zeros(0)
        else:
            blocks = lay.blocks(flat)
            local = torch.topk(blocks.abs(), lay.k, dim=1, sorted=False).indices
            vals = torch.gather(blocks, 1, local).reshape(-1)
        codes, table = quantize(vals, self.quantization_range)
        payload = [pack_indices(local.reshape(-1), lay.bits), pack_2bit(codes), table.contiguous()]
        return payload, make_ctx(x, name)

    def sparse_entries(self, payload: list[Tensor], ctx: Ctx) -> tuple[Tensor, Tensor]:
        """(flat int64 indices, fp32 values): zeros with the values added there is the decode
        (indices are distinct), so memory=residual updates in O(k)."""
        lay = self.layout(ctx.shape)
        local = unpack_indices(payload[0], lay.sent, lay.bits)
        values = decode_2bit(payload[1], lay.sent, payload[2]) if lay.sent else payload[2][:0]
        return lay.flat_indices(local), values

    def sent_indices(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        """Flat indices this payload carries (memory=dgc masks its momentum there)."""
        lay = self.layout(ctx.shape)
        return lay.flat_indices(unpack_indices(payload[0], lay.sent, lay.bits))

    def codes(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        """The 2-bit codes of a payload (tests, inspection)."""
        return unpack_2bit(payload[1], self.layout(ctx.shape).sent)

    def decompress(self, payload: list[Tensor], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        """One worker's decode, unclipped (what its error accumulator takes away)."""
        indices, values = self.sparse_entries(payload, ctx)
        buf = decode_buffer(ctx, values.device, out)
        scatter_add(buf, indices, values.to(buf.dtype))
        return buf.to(ctx.dtype).view(ctx.shape)

    def decompress_all(self, payloads: list[list[Tensor]], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        """Per coordinate, the mean over the workers that sent it of their values clipped to the
        median norm (module docstring); into `out` when given."""
        entries = [self.sparse_entries(p, ctx) for p in payloads]
        factors = clip_factors(torch.stack([v.norm() for _, v in entries]))
        indices = torch.cat([i for i, _ in entries])
        values = torch.cat([v * f for (_, v), f in zip(entries, factors, strict=True)])
        buf = decode_buffer(ctx, values.device, out)
        if indices.numel():
            where, slot, count = torch.unique(indices, return_inverse=True, return_counts=True)
            sums = torch.zeros(where.numel(), dtype=torch.float32, device=values.device)
            sums.index_add_(0, slot, values)
            buf[where] = (sums / count).to(buf.dtype)
        return buf.to(ctx.dtype).view(ctx.shape)

    def aggregate(self, decoded: list[Tensor]) -> Tensor:
        """`decompress_all` on dense decodes, where a worker's sent coordinates are taken to be its
        nonzero ones (a decode cannot tell a sent 0 from an unsent coordinate; the norms are the same)."""
        flat = torch.stack([d.reshape(-1).float() for d in decoded])
        factors = clip_factors(flat.norm(dim=1))
        sums = (flat * factors[:, None]).sum(0)
        count = (flat != 0).sum(0)
        out = torch.where(count > 0, sums / count.clamp(min=1), torch.zeros_like(sums))
        return out.to(decoded[0].dtype).view(decoded[0].shape)

    def payload_bytes(self, shape: torch.Size | tuple[int, ...]) -> int:
        """Exact bytes of the payload of a tensor of `shape`."""
        return self.layout(shape).nbytes()

    def wire_bytes(self, numel: int) -> int | None:
        return None  # the chunks follow the shape: see payload_bytes

    def max_wire_bytes(self, numel: int) -> int:
        """Bound over every shape of `numel` elements (exact for the worst chunk size)."""
        return _max_bytes(numel, self.chunk, self.ratio)


def clip_factors(norms: Tensor) -> Tensor:
    """min(1, median / (norm + 1e-8)) per worker, the lower median of an even count (torch.median)."""
    return (norms.median() / (norms + CLIP_EPS)).clamp(max=1.0)
