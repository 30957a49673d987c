"""`comm=ring`: HiPress CaSync-Ring, a compressed ring allreduce over point-to-point sends (engine=torch).

The flat tensor is cut into N contiguous chunks. Reduce-scatter: rank r encodes its share of chunk r
and sends it to rank r+1; at each of the N-1 hops a rank decodes the partial sum it received, adds
its own share of that chunk and re-encodes the result for the next rank, so that after N-1 hops rank
r holds the encoded sum of chunk r+1 over all ranks. Allgather: those N encoded sums travel N-1 more
hops unchanged; every rank decodes all N of them and divides by N. Per step a rank encodes each chunk
exactly once (N encodes of s/N floats), decodes 2N-1 payloads and sends 2(N-1) payloads of one chunk.

Error feedback: the worker memory is keyed per chunk (`NAME#ring{c}`) and applied to what this rank
encodes, i.e. its own share plus the partial sum it received: what a re-encode drops stays with the
rank that dropped it and goes out next step. With memory=residual, N x result + the sum of every
rank's residuals equals the sum of the gradients exactly (the test checks this). memory=dgc masks
its momentum where a payload sent, and keeps only this rank's own unsent momentum (the other ranks'
unsent share of a partial sum is dropped, as a re-encode without error feedback would).

Only compressors whose ranks combine by averaging can re-encode partial sums (not signum's majority
vote, not PowerSGD's own allreduce protocol). Payload tensors are 1-D, as every compressor sends them.
A tensor with fewer elements than ranks goes through a dense fp32 allreduce.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
from torch import Tensor

from compbench.comm.ps import shard_bounds
from compbench.compressors.base import Compressor, CompressorBase, Ctx, payload_nbytes
from compbench.engines.base import Engine
from compbench.train.metrics import StepStats

# Wire header of one hop: [number of tensors, (numel, dtype code) per tensor], fixed length.
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.int16,
           torch.int8, torch.uint8, torch.bool)
_MAX_TENSORS = 8
_HEADER = 1 + 2 * _MAX_TENSORS
_TAG_HEADER, _TAG_BLOB = 11, 12


def check_reencodable(compressor: Compressor) -> None:
    """ValueError unless a ring may decode, add and re-encode this compressor's partial sums."""
    name = getattr(compressor, "name", type(compressor).__name__)
    if hasattr(compressor, "compress_collective"):
        raise ValueError(f"compressor={name} runs its own allreduce protocol and cannot re-encode partial "
                         "sums in a ring; use comm=allreduce")
    if getattr(type(compressor), "aggregate", CompressorBase.aggregate) is not CompressorBase.aggregate:
        raise ValueError(f"compressor={name} combines ranks by a rule other than the mean, so a ring cannot "
                         "add partial sums; use comm=allgather or comm=ps")


class RingComm:
    """Compressed ring allreduce (CaSync-Ring); blocking, like comm=ps."""

    requires_summable = False
    blocking = True
    engines = ("torch",)  # point-to-point sends: torch.distributed only
    # Config-time checks, before any worker starts (the engine by name, then the built compressor).
    check_compressor = staticmethod(check_reencodable)

    @staticmethod
    def check(engine: str, **_: object) -> None:
        if engine not in RingComm.engines:
            raise ValueError(f"comm=ring needs point-to-point sends, which engine={engine} lacks; "
                             "add engine=torch")

    def __init__(self, engine: Engine, compressor: Compressor, stats: StepStats) -> None:
        self.check(engine.name)
        check_reencodable(compressor)
        self.engine, self.compressor, self.stats = engine, compressor, stats

    def reduce_tensor(self, x: Tensor, name: str, memory) -> tuple[Tensor, int]:
        n, rank = self.engine.size, self.engine.rank
        flat = x.reshape(-1)
        if flat.numel() < n:  # empty chunks otherwise; not worth a compressed path
            return self.engine.allreduce(flat, f"{name}.ring.dense").view(x.shape), 4 * flat.numel()
        bounds = shard_bounds(flat.numel(), n)
        names = [f"{name}#ring{c}" for c in range(n)]

        # Reduce-scatter: encode my share of chunk `rank`, then N-1 hops of decode + add + re-encode.
        payload, template = self._encode(flat, bounds[rank], names[rank], memory, None)
        sent = 0
        for hop in range(n - 1):
            sent += payload_nbytes(payload)
            received = self._exchange(payload)
            c = (rank - 1 - hop) % n
            with self.stats.time("decompress"):
                partial = self.compressor.decompress(received, self._ctx(template, bounds[c], names[c]))
            payload, _ = self._encode(flat, bounds[c], names[c], memory, partial)
        # Allgather: pass the encoded sums on unchanged; chunk (rank+1) % n is the one I finished.
        finals = {(rank + 1) % n: payload}
        for hop in range(n - 1):
            sent += payload_nbytes(payload)
            payload = self._exchange(payload)
            finals[(rank - hop) % n] = payload
        out = torch.empty_like(flat)
        with self.stats.time("decompress"):
            for c, (a, b) in enumerate(bounds):
                decoded = self.compressor.decompress(finals[c], self._ctx(template, (a, b), names[c]))
                out[a:b] = decoded.reshape(-1)
        return out.div_(n).view(x.shape), sent

    def _encode(self, flat: Tensor, bound: tuple[int, int], cname: str, memory, partial: Tensor | None
                ) -> tuple[list[Tensor], Ctx]:
        a, b = bound
        with self.stats.time("compress"):
            y = memory.compensate(flat[a:b], cname)
            if partial is not None:
                y = y + partial.reshape(-1)
            payload, ctx = self.compressor.compress(y, cname)
            memory.update(y, cname, self.compressor, payload, ctx)
        return payload, ctx

    def _ctx(self, template: Ctx, bound: tuple[int, int], cname: str) -> Ctx:
        """The ctx of a peer's payload for chunk `cname`. A ctx is rank-independent by contract, so it is
        this rank's own first ctx of the step with the chunk's name and size; shared-seed indices
        (randk) are drawn again for that name, exactly as the sender drew them."""
        numel = bound[1] - bound[0]
        ctx = replace(template, name=cname, shape=torch.Size([numel]))
        if "indices" in ctx.meta and hasattr(self.compressor, "indices"):
            ctx.meta = {**ctx.meta, "indices": self.compressor.indices(numel, cname, template.device)}
        return ctx

    def _exchange(self, payload: list[Tensor]) -> list[Tensor]:
        """Send `payload` to the next rank and receive the previous rank's: a header, then the bytes."""
        n, rank = self.engine.size, self.engine.rank
        dst, src = (rank + 1) % n, (rank - 1) % n
        device = payload[0].device if payload else torch.device("cpu")
        head_out = _header(payload).to(device)
        blob_out = _to_bytes(payload, device)
        head_in = torch.empty_like(head_out)
        pending = [dist.isend(head_out, dst, tag=_TAG_HEADER)]
        recv_head = dist.irecv(head_in, src, tag=_TAG_HEADER)
        if blob_out.numel():
            pending.append(dist.isend(blob_out, dst, tag=_TAG_BLOB))
        recv_head.wait()
        specs = _parse_header(head_in.cpu())
        nbytes = sum(numel * dtype.itemsize for numel, dtype in specs)
        blob_in = torch.empty(nbytes, dtype=torch.uint8, device=device)
        if blob_in.numel():
            dist.irecv(blob_in, src, tag=_TAG_BLOB).wait()
        for work in pending:
            work.wait()
        return _from_bytes(blob_in, specs)


def _header(payload: list[Tensor]) -> Tensor:
    assert len(payload) <= _MAX_TENSORS, f"a payload of {len(payload)} tensors exceeds the ring header"
    head = torch.zeros(_HEADER, dtype=torch.int64)
    head[0] = len(payload)
    for i, t in enumerate(payload):
        head[1 + 2 * i] = t.numel()
        head[2 + 2 * i] = _DTYPES.index(t.dtype)
    return head


def _parse_header(head: Tensor) -> list[tuple[int, torch.dtype]]:
    count = int(head[0])
    return [(int(head[1 + 2 * i]), _DTYPES[int(head[2 + 2 * i])]) for i in range(count)]


def _to_bytes(payload: list[Tensor], device: torch.device) -> Tensor:
    parts = [t.contiguous().view(-1).view(torch.uint8) for t in payload if t.numel()]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)


def _from_bytes(blob: Tensor, specs: list[tuple[int, torch.dtype]]) -> list[Tensor]:
    out, pos = [], 0
    for numel, dtype in specs:
        nbytes = numel * dtype.itemsize
        # clone: a slice at an odd byte offset cannot be reinterpreted as a wider dtype
        out.append(blob[pos : pos + nbytes].clone().view(dtype))
        pos += nbytes
    return out
