"""The test oracle of sync=demo: compbench's former DeMo optimizer, which exchanged inside its own
`step` (one allgather per tensor). sync=demo now sends through compbench's pipeline
(compressor=chunk_dct, memory=residual, comm=allgather: compbench.sync.demo) and must reproduce this,
bit for bit (tests/unit/test_demo_sync.py); this file is checked against an independent float64
re-implementation of the reference (tests/unit/test_demo_optim.py).


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

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from compbench.compressors.chunk_dct import ChunkDCT, as_chunkable, index_dtype
from compbench.engines.base import Engine
from compbench.records.stats import StepStats


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
