"""DeMo (Peng, Quesnelle, Kingma, 2024): decoupled momentum, exchanged as a chunked DCT top-k.

Reference: bloc97/DeMo `demo.py` (class DeMo, TransformDCT, CompressDCT). Per parameter p with gradient
g (this rank's own, never allreduced), in the reference's order:

    p     *= 1 - lr * weight_decay                 (decoupled, before anything else)
    delta  = decay * delta + lr * g                (the decayed momentum; lr enters here ...)
    C      = DCT-II (orthonormal) of every chunk of delta
    q      = the top-k coefficients of each chunk by magnitude (k = min(topk, chunk elements))
    delta -= IDCT(q)                               (what was sent leaves delta: its error feedback)
    Q      = allgather of every rank's (indices, values); each coefficient is the mean over the
             ranks that sent it (not over all N); coefficients nobody sent are 0
    p     -= lr * sign(IDCT(Q))                    (... and here: a plain SGD step on the sign)

Chunks: a dimension d is cut into pieces of c = the largest divisor of d not above
`compression_chunk` (64; d itself when d < 64), as the reference's `_get_smaller_split`. A matrix
(R, C) is cut into (R/c1) x (C/c2) chunks, each transformed along both axes (2-D DCT), its
coefficients numbered row-major (index a*c2 + b for coefficient (a, b)), as the reference's
`rearrange(..., "y x h w -> y x (h w)")`; a vector of length L into L/c chunks.

Deviations, and why:
- Tensors of more than two dimensions (convolution weights), which the reference cannot take, are
  viewed as the matrix (shape[0], prod(shape[1:])): output channels by fan-in, the layout every
  matrix-based method (PowerSGD, ATOMO) uses. A 0-d tensor is a vector of one element.
- Indices travel as int16 (int32 when a chunk has more than 32768 coefficients), handed to the
  engine as their raw bytes (a uint8 view: NCCL has no int16), instead of the reference's int64:
  an index only numbers a coefficient inside its chunk (< 4096 with 64x64 chunks), so nothing is
  lost. A 64x64 chunk then costs 32 * (2 + 4) bytes against 4096 * 4 dense: 85x, the paper's
  "up to 85x" (with int64 indices it would be 43x). Values keep the parameter dtype.
- The DCT is a precomputed orthonormal DCT-II matrix (float64 cosines, cast to the parameter dtype)
  applied by einsum; the reference builds the same matrix through an FFT (equal to float rounding).
- The reference writes sign(decoded) into p.grad and calls torch.optim.SGD.step; here the step is
  applied directly and p.grad keeps the local gradient.
- A parameter whose .grad is None is skipped (every rank must skip the same ones: the model is the
  same on every rank). The reference would fail on it.

Bytes booked per parameter and step (this rank): one allgather of [indices, values], i.e.
chunks * k * (index bytes + value bytes); one compressed call; bytes_dense 4 * numel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from compbench.engines.base import Engine
from compbench.stats import StepStats

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
        k = torch.arange(n, dtype=torch.float64).view(-1, 1)
        i = torch.arange(n, dtype=torch.float64).view(1, -1)
        d = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
        d[0] /= math.sqrt(2.0)
        _BASES[key] = d.to(dtype=dtype, device=device)
    return _BASES[key]


def as_chunkable(x: Tensor) -> Tensor:
    """The 1-D or 2-D view DeMo chunks: vectors as they are, a 0-d tensor as one element, anything
    of more dimensions as (shape[0], prod(shape[1:]))."""
    if x.dim() == 0:
        return x.reshape(1)
    if x.dim() > 2:
        return x.reshape(x.shape[0], -1)
    return x


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
        self.chunks = math.prod(d // c for d, c in zip(shape, self.sizes, strict=True))

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


class DeMo(torch.optim.Optimizer):
    """DeMo: each rank keeps a decayed momentum `delta`, sends the top-k DCT coefficients of every
    chunk of it (allgather), and steps by the sign of the decoded average. No gradient allreduce:
    the trainer hands it each rank's own gradients. State per parameter: `step`, `delta`."""

    def __init__(self, params: Iterable[Any], *, engine: Engine, stats: StepStats, lr: float,
                 compression_decay: float = 0.999, compression_topk: int = 32, compression_chunk: int = 64,
                 weight_decay: float = 0.0) -> None:
        if not lr >= 0.0:
            raise ValueError(f"DeMo lr={lr} must be >= 0")
        if not 0.0 <= compression_decay < 1.0:
            raise ValueError(f"DeMo compression_decay={compression_decay} must be in [0, 1), e.g. 0.999")
        if not (isinstance(compression_topk, int) and compression_topk >= 1):
            raise ValueError(f"DeMo compression_topk={compression_topk} must be an integer >= 1 (e.g. 32)")
        if not (isinstance(compression_chunk, int) and compression_chunk >= 1):
            raise ValueError(f"DeMo compression_chunk={compression_chunk} must be an integer >= 1 (e.g. 64)")
        if not weight_decay >= 0.0:
            raise ValueError(f"DeMo weight_decay={weight_decay} must be >= 0")
        defaults = dict(lr=lr, compression_decay=compression_decay, compression_topk=compression_topk,
                        compression_chunk=compression_chunk, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.engine, self.stats = engine, stats
        self._transforms: dict[tuple[torch.Size, int, torch.dtype, torch.device], ChunkDCT] = {}

    def _transform(self, x: Tensor, target: int) -> ChunkDCT:
        key = (x.shape, target, x.dtype, x.device)
        if key not in self._transforms:
            self._transforms[key] = ChunkDCT(x.shape, target, x.dtype, x.device)
        return self._transforms[key]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]  # torch's overloads
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                if p.grad is not None:
                    self._step_param(p, group, f"demo.{gi}.{pi}")
        return loss

    def _step_param(self, p: Tensor, group: dict[str, Any], name: str) -> None:
        lr, stats = group["lr"], self.stats
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["delta"] = torch.zeros(p.shape, dtype=p.dtype, device=p.device)  # contiguous: views below
        state["step"] += 1
        delta: Tensor = state["delta"]
        with stats.time("compress"):
            if group["weight_decay"] != 0.0:
                p.mul_(1.0 - lr * group["weight_decay"])
            delta.mul_(group["compression_decay"]).add_(p.grad, alpha=lr)  # type: ignore[arg-type]  # stepped: has one
            view = as_chunkable(delta)
            tf = self._transform(view, group["compression_chunk"])
            coef = tf.encode(view)
            k = min(group["compression_topk"], tf.per_chunk)
            idx = torch.topk(coef.abs(), k, dim=-1, largest=True, sorted=False).indices
            val = torch.gather(coef, -1, idx)
            sent = torch.zeros_like(coef).scatter_(-1, idx, val)
            delta.sub_(tf.decode(sent).view(delta.shape))  # delta keeps what was not sent
            # as raw bytes: NCCL has no int16 type, and the collective only moves the bytes
            wire_idx = idx.to(index_dtype(tf.per_chunk)).view(torch.uint8)
        with stats.time("comm"):
            gathered = self.engine.allgather([wire_idx, val], name)
        stats.bytes_sent += wire_idx.numel() * wire_idx.element_size() + val.numel() * val.element_size()
        stats.bytes_dense += 4 * p.numel()
        stats.calls_compressed += 1
        with stats.time("decompress"):
            dtype = index_dtype(tf.per_chunk)
            all_idx = torch.cat([g[0].to(p.device).view(dtype).long() for g in gathered], dim=-1)
            all_val = torch.cat([g[1].to(device=p.device) for g in gathered], dim=-1)
            # the mean over the ranks that sent each coefficient (include_self=False: not over N)
            mean = torch.zeros_like(coef).scatter_reduce_(-1, all_idx, all_val, reduce="mean",
                                                          include_self=False)
            update = tf.decode(mean).reshape(p.shape)
            p.add_(update.sign_(), alpha=-lr)
