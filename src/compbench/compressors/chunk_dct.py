"""`chunk_dct`: DeMo's compression (Peng, Quesnelle, Kingma, 2024; reference bloc97/DeMo `demo.py`,
TransformDCT and CompressDCT): a tensor cut into chunks, each chunk's DCT-II coefficients, the `topk`
largest by magnitude per chunk sent with their indices; every coefficient averaged over the ranks
that sent it (not over all N; coefficients nobody sent are 0), then transformed back.

Chunks: a dimension d is cut into pieces of c = the largest divisor of d not above `chunk` (64; d
itself when d < 64), as the reference's `_get_smaller_split`. A matrix (R, C) is cut into
(R/c1) x (C/c2) chunks, each transformed along both axes (2-D DCT), its coefficients numbered
row-major (index a*c2 + b for coefficient (a, b)), as the reference's
`rearrange(..., "y x h w -> y x (h w)")`; a vector of length L into L/c chunks.

Under `sync=demo` the error-feedback memory is DeMo's decayed momentum: memory=residual with
beta = the decay and gamma = the learning rate gives the reference's `delta = decay*delta + lr*g`,
and its update (what was sent leaves the buffer) the reference's `delta -= IDCT(q)`. As a compressor
of its own it works under any mode, e.g. per-step gradients with memory=residual.

Deviations from the reference, and why:
- Tensors of more than two dimensions (convolution weights), which the reference cannot take, are
  viewed as the matrix (shape[0], prod(shape[1:])): output channels by fan-in, the layout every
  matrix-based method (PowerSGD, ATOMO) uses. A 0-d tensor is a vector of one element.
- Indices travel as int16 (int32 when a chunk has more than 32768 coefficients), handed to the
  engine as their raw bytes (a uint8 view: NCCL has no int16), instead of the reference's int64:
  an index only numbers a coefficient inside its chunk (< 4096 with 64x64 chunks), so nothing is
  lost. A 64x64 chunk then costs 32 * (2 + 4) bytes against 4096 * 4 dense: 85x, the paper's
  "up to 85x" (with int64 indices it would be 43x). Values keep the tensor's dtype.
- The DCT is a precomputed orthonormal DCT-II matrix (float64 cosines, cast to the tensor's dtype)
  applied by einsum; the reference builds the same matrix through an FFT (equal to float rounding).

Wire (exact): chunks * k * (index bytes + value bytes), k = min(topk, coefficients per chunk).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from compbench.codec.base import Capabilities, CompressorBase, Ctx, make_ctx

_BASES: dict[tuple[int, torch.dtype, torch.device], Tensor] = {}


def chunk_size(dim: int, target: int) -> int:
    """The largest divisor of `dim` that is at most `target` (`dim` itself when dim < target):
    the reference's `_get_smaller_split`."""
    return max(d for d in range(1, min(dim, target) + 1) if dim % d == 0)


def dct_matrix(n: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Tensor:
    """The orthonormal DCT-II matrix D (n x n): coefficients = D @ x, and x = D.T @ coefficients
    (D is orthogonal, so its transpose is the inverse, a DCT-III)."""
    key = (n, dtype, torch.device(device))
    if key not in _BASES:
        k = torch.arange(n, dtype=torch.float64, device="cpu").view(-1, 1)  # built once on the host
        i = torch.arange(n, dtype=torch.float64, device="cpu").view(1, -1)
        d = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
        d[0] /= math.sqrt(2.0)
        _BASES[key] = d.to(dtype=dtype, device=device)
    return _BASES[key]


def chunkable_shape(shape: torch.Size) -> torch.Size:
    """The 1-D or 2-D shape DeMo chunks: vectors as they are, a 0-d tensor as one element,
    anything of more dimensions as (shape[0], prod(shape[1:]))."""
    if len(shape) == 0:
        return torch.Size([1])
    if len(shape) > 2:
        return torch.Size([shape[0], math.prod(shape[1:])])
    return shape


def as_chunkable(x: Tensor) -> Tensor:
    """`x` viewed in its `chunkable_shape`."""
    return x.reshape(chunkable_shape(x.shape))


def index_dtype(coefficients: int) -> torch.dtype:
    """The narrowest signed integer type that numbers `coefficients` per chunk."""
    return torch.int16 if coefficients <= 1 << 15 else torch.int32


class ChunkDCT:
    """Chunked DCT-II of one tensor shape (1-D or 2-D): `encode` -> (chunks..., coefficients per
    chunk) with the coefficients flattened row-major; `decode` is its exact inverse."""

    def __init__(self, shape: torch.Size, target: int, dtype: torch.dtype, device: torch.device) -> None:
        self.shape = shape
        self.sizes = [chunk_size(d, target) for d in shape]
        self.bases = [dct_matrix(c, dtype, device) for c in self.sizes]
        self.per_chunk = math.prod(self.sizes)
        self.grid = [d // c for d, c in zip(shape, self.sizes, strict=True)]  # chunks along each dimension
        self.chunks = math.prod(self.grid)

    @property
    def coef_shape(self) -> tuple[int, ...]:
        """The shape `encode` returns."""
        return (*self.grid, self.per_chunk)

    def encode(self, x: Tensor) -> Tensor:
        if x.dim() == 1:
            (c,), (d,) = self.sizes, self.bases
            return x.reshape(-1, c) @ d.T  # (chunks, c)
        (c1, c2), (d1, d2) = self.sizes, self.bases
        blocks = x.reshape(x.shape[0] // c1, c1, x.shape[1] // c2, c2)
        coef = torch.einsum("yhxw,ah,bw->yxab", blocks, d1, d2)
        return coef.reshape(coef.shape[0], coef.shape[1], c1 * c2)  # (row chunks, col chunks, c1*c2)

    def decode(self, coef: Tensor) -> Tensor:
        if len(self.shape) == 1:
            return (coef @ self.bases[0]).reshape(self.shape)
        (c1, c2), (d1, d2) = self.sizes, self.bases
        blocks = coef.reshape(coef.shape[0], coef.shape[1], c1, c2)
        return torch.einsum("yxab,ah,bw->yhxw", blocks, d1, d2).reshape(self.shape)


class ChunkDCTTopK(CompressorBase):
    """The top-`topk` DCT coefficients of every chunk (see the module). Payload: [indices as raw
    bytes (int16 or int32, uint8 view), values]; ctx carries nothing rank-dependent."""

    name = "chunk_dct"
    caps = Capabilities(combine="sender_mean", shape_layout=True, recipe={"memory": "residual"})

    def __init__(self, topk: int = 32, chunk: int = 64) -> None:
        for key, value in (("topk", topk), ("chunk", chunk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"compressor.{key}={value} must be an integer >= 1; pass e.g. "
                                 f"compressor.{key}={32 if key == 'topk' else 64}")
        most = 2 * chunk * chunk // 3  # an index and a value (6 bytes) per coefficient, against 4 dense
        if topk > most:
            raise ValueError(f"compressor.topk={topk} of a {chunk}x{chunk} chunk's {chunk * chunk} "
                             "coefficients would send more than the chunk dense (6 bytes each against 4); "
                             f"pass compressor.topk={most} or less")
        self.topk, self.chunk = topk, chunk
        self._transforms: dict[tuple[torch.Size, torch.dtype, torch.device], ChunkDCT] = {}

    def transform(self, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> ChunkDCT:
        """The chunked DCT of a tensor of this shape (cached)."""
        key = (chunkable_shape(shape), dtype, device)
        if key not in self._transforms:
            self._transforms[key] = ChunkDCT(key[0], self.chunk, dtype, device)
        return self._transforms[key]

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        tf = self.transform(x.shape, x.dtype, x.device)
        coef = tf.encode(as_chunkable(x))
        k = min(self.topk, tf.per_chunk)
        idx = torch.topk(coef.abs(), k, dim=-1, largest=True, sorted=False).indices
        values = torch.gather(coef, -1, idx)
        # as raw bytes: NCCL has no int16 type, and the collective only moves the bytes
        return [idx.to(index_dtype(tf.per_chunk)).view(torch.uint8), values], make_ctx(x, name)

    def _entries(self, payload: list[Tensor], tf: ChunkDCT, device: torch.device) -> tuple[Tensor, Tensor]:
        """(int64 indices, values), each (chunks..., k): a payload that travelled as flat bytes
        (comm=ps's all-to-all) is shaped back."""
        k = min(self.topk, tf.per_chunk)
        wire, values = (t.to(device) for t in payload)
        shape = (*tf.grid, k)
        return wire.view(index_dtype(tf.per_chunk)).long().view(shape), values.view(shape)

    def decompress(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        tf = self.transform(ctx.shape, ctx.dtype, ctx.device)
        indices, values = self._entries(payload, tf, ctx.device)
        coef = torch.zeros(tf.coef_shape, dtype=values.dtype, device=ctx.device)
        coef.scatter_(-1, indices, values)
        return tf.decode(coef).view(ctx.shape)

    def decompress_all(self, payloads: list[list[Tensor]], ctx: Ctx) -> Tensor:
        """Every coefficient's mean over the ranks that sent it, transformed back."""
        tf = self.transform(ctx.shape, ctx.dtype, ctx.device)
        entries = [self._entries(p, tf, ctx.device) for p in payloads]
        indices = torch.cat([i for i, _ in entries], dim=-1)
        values = torch.cat([v for _, v in entries], dim=-1)
        mean = torch.zeros(tf.coef_shape, dtype=values.dtype, device=ctx.device)
        mean.scatter_reduce_(-1, indices, values, reduce="mean", include_self=False)
        return tf.decode(mean).reshape(ctx.shape)

    def aggregate(self, decoded: list[Tensor]) -> Tensor:
        """`decompress_all` from dense decodes: each decode transformed again, its top-k
        coefficients per chunk taken as what its rank sent (equal to float rounding)."""
        x = decoded[0]
        tf = self.transform(x.shape, x.dtype, x.device)
        k = min(self.topk, tf.per_chunk)
        payloads = []
        for d in decoded:
            coef = tf.encode(as_chunkable(d))
            idx = torch.topk(coef.abs(), k, dim=-1, largest=True, sorted=False).indices
            wire = idx.to(index_dtype(tf.per_chunk)).view(torch.uint8)
            payloads.append([wire, torch.gather(coef, -1, idx)])
        return self.decompress_all(payloads, make_ctx(x, "aggregate"))

    def wire_bytes(self, numel: int) -> int | None:
        return None  # the chunks follow the shape (`caps.shape_layout`): see payload_bytes

    def max_wire_bytes(self, numel: int) -> int:
        """Bound over every shape: every coefficient sent, with an index of at most 4 bytes."""
        return numel * 8

    def payload_bytes(self, shape: torch.Size, dtype: torch.dtype = torch.float32) -> int:
        """The exact payload of a tensor of `shape`: chunks * k * (index + value bytes)."""
        tf = ChunkDCT(chunkable_shape(shape), self.chunk, dtype, torch.device("cpu"))
        k = min(self.topk, tf.per_chunk)
        return tf.chunks * k * (index_dtype(tf.per_chunk).itemsize + dtype.itemsize)
