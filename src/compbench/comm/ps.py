"""`comm=ps`: HiPress CaSync's parameter-server topology without a server machine.

Every rank is the server of 1/N of every tensor. A rank splits its (error-compensated) tensor into N
contiguous shards and compresses each, with worker-side error feedback per shard; an all-to-all
delivers shard j of every rank to rank j; the server decodes the N shards it received, averages
them, adds its own server-side residual and re-compresses (server error feedback, for biased
compressors only); an all-gather of the re-compressed shards gives every rank the whole averaged
tensor, decoded shard by shard.
Summable compressors (none, fp16, randk: same layout on every rank) skip the server's decode and
re-compression: the server averages the payloads themselves, so the aggregate is exact.
A compressor whose payload can be cut (`Capabilities.split_unit`: rms_sign's bits, 1-bit Adam's
exchange) is compressed once per tensor instead, its error feedback kept for the whole tensor, and
each server gets its part of the payload (shards at multiples of `split_unit` elements).
Compressed bytes cross the wire twice, each time 1/N of the tensor per peer, instead of N payloads
of the whole tensor (allgather). Works with every compressor.

`reduce_many` (scheduler=bucket, DiLoCo's outer exchange) runs the same exchange for several tensors
at once: one all-to-all and one all-gather for all of them. Where the payloads' sizes are not known
in advance (neither exact `wire_bytes` nor `Capabilities.shape_layout`), an all-to-all of their
element counts goes first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import torch
from torch import Tensor

from compbench.codec.base import Compressor, Ctx, SplitsPayload, same_layout, votes
from compbench.comm.base import BlockingComm, CommTraits, encode
from compbench.engines import wire
from compbench.engines.base import Engine, Handle
from compbench.memory.base import Memory
from compbench.memory.none import NoMemory
from compbench.memory.residual import ResidualMemory
from compbench.records.stats import StepStats

Payload = list[Tensor]


def shard_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous, nearly equal shards (the first numel % parts get one more element)."""
    base, extra = divmod(numel, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + base + (i < extra)
        bounds.append((start, end))
        start = end
    return bounds


def split_bounds(numel: int, parts: int, unit: int) -> list[tuple[int, int]]:
    """`shard_bounds` over blocks of `unit` elements (the last block may be short): every shard
    starts at a multiple of `unit`; equal shards when numel is a multiple of parts * unit."""
    blocks = -(-numel // unit)
    return [(min(a * unit, numel), min(b * unit, numel)) for a, b in shard_bounds(blocks, parts)]


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
    traits: ClassVar[CommTraits] = CommTraits(blocking=True, pattern="ps", packs=True,
                                                        elastic=False)  # server memory: a shard per rank

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
        (averaged,), sent = self._exchange(name, [(name, x)], memory)
        return averaged, sent

    def reduce_many(self, name: str, items: list[tuple[str, Tensor]], memory: Memory) -> Handle:
        averaged, sent = self._exchange(name, items, memory)
        if sent:
            self.book(sent)
        return Handle.done(averaged)

    def _exchange(self, name: str, items: list[tuple[str, Tensor]],
                  memory: Memory) -> tuple[list[Tensor], int]:
        n, rank = self.engine.size, self.engine.rank
        # 1. worker: every tensor's shards, compressed (shard j is for server j)
        shards = [self._worker(x, item, memory) for item, x in items]
        # 2. all-to-all: shard j of every tensor to server j
        outgoing = [[s[j][0] for s in shards] for j in range(n)]
        received, sent = self._alltoall(name, outgoing, like=[s[rank] for s in shards])
        # 3. server: average my shard of every tensor, re-compress it with server error feedback
        server_ctxs = [[c for _, c in s] if self.sums_payloads else
                       [replace(c, name=f"{c.name}@server") for _, c in s] for s in shards]
        mine = [self._serve([received[i][t] for i in range(n)], shards[t][rank][1],
                            server_ctxs[t][rank].name) for t in range(len(items))]
        # 4. all-gather of the re-compressed shards; everyone decodes every shard of every tensor
        gathered, sent_back = self._allgather(name, mine, [[c.shape for c in cs] for cs in server_ctxs])
        out = []
        with self.stats.time("decompress"):
            for t, (_, x) in enumerate(items):
                parts = [self.compressor.decompress(gathered[j][t], server_ctxs[t][j]) for j in range(n)]
                out.append(torch.cat([p.reshape(-1) for p in parts]).view(x.shape))
        return out, sent + sent_back

    def _worker(self, x: Tensor, name: str, memory: Memory) -> list[tuple[Payload, Ctx]]:
        """(payload, ctx) of each of the N shards of `x`, compensated by `memory`."""
        n, unit = self.engine.size, self.compressor.caps.split_unit
        names = [f"{name}#ps{j}" for j in range(n)]
        if unit:  # compressed once, error feedback over the whole tensor, the payload cut in N
            assert isinstance(self.compressor, SplitsPayload)  # Capabilities.split_unit
            payload, ctx = encode(self.compressor, memory, x, name, self.stats)
            return self.compressor.split(payload, ctx, split_bounds(x.numel(), n, unit), names)
        return [encode(self.compressor, memory, part, sname, self.stats)
                for part, sname in zip(shards_of(x, n), names, strict=True)]

    def _alltoall(self, name: str, outgoing: list[list[Payload]],
                  like: list[tuple[Payload, Ctx]]) -> tuple[list[list[Payload]], int]:
        """Send outgoing[j] (one payload per tensor) to rank j; returns, per source rank, its
        payloads for this rank's shards, and the bytes this rank sent. `like`: this rank's own
        (payload, ctx) of its shards: a peer's payload for the same shard has the same layout
        where the compressor says so (`same_layout`), and no counts travel then."""
        n = self.engine.size
        known = None
        if all(same_layout(self.compressor, ctx.shape) for _, ctx in like):
            specs = [[[(t.numel(), t.dtype) for t in p] for p, _ in like]] * n
            known = [sum(wire.nbytes(spec) for spec in specs[0])] * n
        else:  # the element counts of every payload tensor first
            counts = torch.tensor([[t.numel() for p in dest for t in p] for dest in outgoing],
                                  dtype=torch.int64, device="cpu")  # sizes: host-side
            recv_counts, _ = self.engine.alltoall(counts.view(-1), [counts.shape[1]] * n, f"{name}.ps.n")
            specs = []
            for row in recv_counts.view(n, -1).tolist():
                it = iter(row)
                specs.append([[(next(it), t.dtype) for t in p] for p, _ in like])
        blobs = [wire.to_bytes([t for p in dest for t in p]) for dest in outgoing]
        recv, _ = self.engine.alltoall(torch.cat(blobs), [len(b) for b in blobs], f"{name}.ps.a2a",
                                       known)
        received, pos = [], 0
        for source in specs:
            payloads = []
            for spec in source:
                payloads.append(wire.from_bytes(recv[pos : pos + wire.nbytes(spec)], spec))
                pos += wire.nbytes(spec)
            received.append(payloads)
        return received, sum(len(b) for b in blobs)

    def _serve(self, received: list[Payload], ctx: Ctx, name: str) -> Payload:
        """The server's payload for its shard of one tensor: the average of the N payloads it received."""
        if self.sums_payloads:
            # Same layout on every rank (randk's shared indices, fp16, none): the average of the
            # payloads IS the payload of the average; nothing is lost to a second compression.
            with self.stats.time("decompress"):
                return [torch.stack([p[i].float() for p in received]).mean(0).to(t.dtype)
                        for i, t in enumerate(received[0])]
        # The server's compressor state (momentum, residuals, seeds) is kept apart from the worker's.
        with self.stats.time("decompress"):
            averaged = self.compressor.decompress_all(received, ctx)
        return self._reencode(averaged, name)

    def _allgather(self, name: str, mine: list[Payload],
                   shapes: list[list[torch.Size]]) -> tuple[list[list[Payload]], int]:
        """Every rank's server payloads (one per tensor), as ONE allgather; `shapes[t][j]`: the
        shape of server j's shard of tensor t (every server's payload has this rank's layout where
        the shards are alike and the compressor's layout follows from the shape, `same_layout`)."""
        flat = [t for p in mine for t in p]
        exact = all(len(set(ss)) == 1 and same_layout(self.compressor, ss[0]) for ss in shapes)
        if exact:
            gathered = self.engine.allgather_payload_async(flat, f"{name}.ps.ag", None)
        else:
            gathered = self.engine.allgather_uneven_async(flat, f"{name}.ps.ag")
        per_rank, sent = gathered.wait()
        out = []
        for payload in per_rank:
            it = iter(payload)
            out.append([[next(it) for _ in p] for p in mine])
        return out, sent

    def _reencode(self, averaged: Tensor, name: str) -> Payload:
        """The server's payload for the average of its shard: the compressor's own server rule
        when it has one (signum: the vote's sign), else a compress, with server error feedback
        for biased compressors."""
        if votes(self.compressor):  # Capabilities.combine "vote"
            with self.stats.time("compress"):
                return self.compressor.server_compress(averaged, name)[0]
        memory = self.server_memory if self.server_feedback else NoMemory()
        return encode(self.compressor, memory, averaged, name, self.stats)[0]

    def state_dict(self) -> dict:
        return {"server_memory": self.server_memory.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.server_memory.load_state_dict(state.get("server_memory", {}))
