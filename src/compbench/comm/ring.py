"""`comm=ring`: HiPress CaSync-Ring, a compressed ring allreduce over the engine's ring hop `shift`
(torch.distributed: isend/irecv; Horovod: an all-to-all in which only the next rank gets data).

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
from torch import Tensor

from compbench.codec.base import Ctx, payload_nbytes, shares_indices
from compbench.comm.base import BlockingComm, CommTraits, encode
from compbench.comm.ps import shard_bounds
from compbench.memory.base import Memory


class RingComm(BlockingComm):
    """Compressed ring allreduce (CaSync-Ring); blocking, like comm=ps."""

    traits = CommTraits(blocking=True, reencodes_sums=True, pattern="allreduce")

    def exchange(self, x: Tensor, name: str, memory: Memory) -> tuple[Tensor, int]:
        n, rank = self.engine.size, self.engine.rank
        flat = x.reshape(-1)
        if flat.numel() < n:  # empty chunks otherwise; not worth a compressed path
            self.stats.add_dense_allreduce(4 * flat.numel(), calls=1)
            return self.engine.allreduce(flat, f"{name}.ring.dense").view(x.shape), 0
        bounds = shard_bounds(flat.numel(), n)
        names = [f"{name}#ring{c}" for c in range(n)]

        # Reduce-scatter: encode my share of chunk `rank`, then N-1 hops of decode + add + re-encode.
        payload, template = self._encode(flat, bounds[rank], names[rank], memory, None)
        sent = 0
        for hop in range(n - 1):
            sent += payload_nbytes(payload)
            received = self._exchange(payload, name)
            c = (rank - 1 - hop) % n
            with self.stats.time("decompress"):
                partial = self.compressor.decompress(received, self._ctx(template, bounds[c], names[c]))
            payload, _ = self._encode(flat, bounds[c], names[c], memory, partial)
        # Allgather: pass the encoded sums on unchanged; chunk (rank+1) % n is the one I finished.
        finals = {(rank + 1) % n: payload}
        for hop in range(n - 1):
            sent += payload_nbytes(payload)
            payload = self._exchange(payload, name)
            finals[(rank - hop) % n] = payload
        out = torch.empty_like(flat)
        with self.stats.time("decompress"):
            for c, (a, b) in enumerate(bounds):
                decoded = self.compressor.decompress(finals[c], self._ctx(template, (a, b), names[c]))
                out[a:b] = decoded.reshape(-1)
        return out.div_(n).view(x.shape), sent

    def _encode(self, flat: Tensor, bound: tuple[int, int], cname: str, memory: Memory,
                partial: Tensor | None) -> tuple[list[Tensor], Ctx]:
        a, b = bound
        return encode(self.compressor, memory, flat[a:b], cname, self.stats, partial)

    def _ctx(self, template: Ctx, bound: tuple[int, int], cname: str) -> Ctx:
        """The ctx of a peer's payload for chunk `cname`. A ctx is rank-independent by contract, so it is
        this rank's own first ctx of the step with the chunk's name and size; shared-seed indices
        (randk) are drawn again for that name, exactly as the sender drew them."""
        numel = bound[1] - bound[0]
        ctx = replace(template, name=cname, shape=torch.Size([numel]))
        if shares_indices(self.compressor):
            indices = self.compressor.indices(numel, cname, template.device)
            ctx.meta = {**ctx.meta, "indices": indices}
        return ctx

    def _exchange(self, payload: list[Tensor], name: str) -> list[Tensor]:
        """Send `payload` to the next rank and receive the previous rank's."""
        n, rank = self.engine.size, self.engine.rank
        return self.engine.shift(payload, (rank + 1) % n, (rank - 1) % n, f"{name}.ring")
