"""`comm=ps`: HiPress CaSync's parameter-server topology without a server machine.

Every rank is the server of 1/N of every tensor. A rank splits its (error-compensated) tensor into N
contiguous shards and compresses each, with worker-side error feedback per shard; an all-to-all
delivers shard j of every rank to rank j; the server decodes the N shards it received, averages
them, adds its own server-side residual and re-compresses (server error feedback, for biased
compressors only); an all-gather of the re-compressed shards gives every rank the whole averaged
tensor, decoded shard by shard.
Summable compressors (none, fp16, randk: same layout on every rank) skip the server's decode and
re-compression: the server averages the payloads themselves, so the aggregate is exact.
Compressed bytes cross the wire twice, each time 1/N of the tensor per peer, instead of N payloads
of the whole tensor (allgather). Works with every compressor.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import torch
from torch import Tensor

from compbench.comm.base import BlockingComm, CommTraits, encode
from compbench.compressors.base import Compressor, payload_nbytes
from compbench.engines import wire
from compbench.engines.base import Engine
from compbench.memory.base import Memory
from compbench.memory.none import NoMemory
from compbench.memory.residual import ResidualMemory
from compbench.stats import StepStats


def shard_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous, nearly equal shards (the first numel % parts get one more element)."""
    base, extra = divmod(numel, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + base + (i < extra)
        bounds.append((start, end))
        start = end
    return bounds


def shards_of(x: Tensor, parts: int) -> list[Tensor]:
    """The `parts` contiguous shards of `x` (views), in order. A tensor of two or more dimensions
    with at least `parts` rows is cut by rows of its (rows, rest) matrix, so every shard is still a
    matrix (ATOMO and PowerSGD compress matrices and send 1-D tensors dense); anything else is cut
    by elements (`shard_bounds`)."""
    if x.dim() >= 2 and x.shape[0] >= parts:
        rows = x.reshape(x.shape[0], -1)
        return [rows[a:b] for a, b in shard_bounds(x.shape[0], parts)]
    flat = x.reshape(-1)
    return [flat[a:b] for a, b in shard_bounds(flat.numel(), parts)]


class PSComm(BlockingComm):
    traits: ClassVar[CommTraits] = CommTraits(blocking=True, pattern="ps")

    def __init__(self, engine: Engine, compressor: Compressor, stats: StepStats) -> None:
        super().__init__(engine, compressor, stats)
        self.server_memory = ResidualMemory()
        # Payloads that add element-wise (`summable`) are averaged by the server as they are,
        # instead of decoded and compressed again.
        self.sums_payloads = compressor.caps.summable
        # Server error feedback only for biased compressors: an unbiased one rescales what it keeps
        # (ATOMO by 1/p), is not contractive, and feeding its error back made ATOMO over ps
        # diverge (14% on digits); unbiased, the server's re-encode needs no correction.
        self.server_feedback = not compressor.caps.unbiased

    def exchange(self, x: Tensor, name: str, memory: Memory) -> tuple[Tensor, int]:
        n, rank = self.engine.size, self.engine.rank
        shard_names = [f"{name}#ps{j}" for j in range(n)]
        # 1. worker: compensate and compress each shard (shard j is for server j)
        encoded = [encode(self.compressor, memory, part, sname, self.stats)
                   for part, sname in zip(shards_of(x, n), shard_names, strict=True)]
        payloads, ctxs = [p for p, _ in encoded], [c for _, c in encoded]
        # 2. all-to-all: per-tensor element counts first, then the bytes
        counts = torch.tensor([[t.numel() for t in p] for p in payloads], dtype=torch.int64)
        recv_counts, _ = self.engine.alltoall(counts.view(-1), [counts.shape[1]] * n, f"{name}.ps.n")
        blobs = [wire.to_bytes(p) for p in payloads]
        recv, _ = self.engine.alltoall(torch.cat(blobs), [len(b) for b in blobs], f"{name}.ps.a2a")
        sent = sum(len(b) for b in blobs)
        # 3. server: decode the N shards received for my part, average, re-compress with server EF
        my_ctx, like = ctxs[rank], payloads[rank]
        received, pos = [], 0
        for counts_j in recv_counts.view(n, -1).tolist():
            specs = [(c, t.dtype) for c, t in zip(counts_j, like, strict=True)]
            received.append(wire.from_bytes(recv[pos : pos + wire.nbytes(specs)], specs))
            pos += wire.nbytes(specs)
        if self.sums_payloads:
            # Same layout on every rank (randk's shared indices, fp16, none): the average of the
            # payloads IS the payload of the average; nothing is lost to a second compression.
            server_ctxs = ctxs
            with self.stats.time("decompress"):
                server_payload = [torch.stack([p[i].float() for p in received]).mean(0).to(t.dtype)
                                  for i, t in enumerate(like)]
        else:
            # The server's compressor state (momentum, residuals, seeds) is kept apart from the worker's.
            server_ctxs = [replace(c, name=f"{c.name}@server") for c in ctxs]
            with self.stats.time("decompress"):
                averaged_shard = self.compressor.decompress_all(received, my_ctx)
            server_payload = self._reencode(averaged_shard, server_ctxs[rank].name)
        sent += payload_nbytes(server_payload)
        # 4. all-gather of the re-compressed shards; everyone decodes every shard
        gathered = self.engine.allgather(server_payload, f"{name}.ps.ag")
        with self.stats.time("decompress"):
            shards = [self.compressor.decompress(gathered[j], server_ctxs[j]) for j in range(n)]
        return torch.cat([s.reshape(-1) for s in shards]).view(x.shape), sent

    def _reencode(self, averaged: Tensor, name: str) -> list[Tensor]:
        """The server's payload for the average of its shard: the compressor's own server rule
        when it has one (signum: the vote's sign), else a compress, with server error feedback
        for biased compressors."""
        if self.compressor.caps.combine == "vote":
            with self.stats.time("compress"):
                return self.compressor.server_compress(averaged, name)[0]  # type: ignore[attr-defined]
        memory = self.server_memory if self.server_feedback else NoMemory()
        return encode(self.compressor, memory, averaged, name, self.stats)[0]

    def state_dict(self) -> dict:
        return {"server_memory": self.server_memory.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.server_memory.load_state_dict(state.get("server_memory", {}))
