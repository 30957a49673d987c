"""`comm=allgather`: every rank receives every rank's payload (sizes may differ), decodes all of
them and averages. Works for any compressor; the only choice for rank-dependent sparse indices."""

from __future__ import annotations

from torch import Tensor

from compbench.comm.base import CommBase, encode
from compbench.engines.base import Handle
from compbench.memory.base import Memory


class AllgatherComm(CommBase):
    def reduce(self, grad: Tensor, name: str, memory: Memory) -> Handle:
        payload, ctx = encode(self.compressor, memory, grad, name, self.stats)
        self.book_payload(payload)
        gathered = self.engine.allgather_async(payload, name)

        def finish() -> Tensor:
            payloads = gathered.wait()
            with self.stats.time("decompress"):
                return self.compressor.decompress_all(payloads, ctx)

        return Handle(finish)
