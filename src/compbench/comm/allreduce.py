"""`comm=allreduce`: average the payload tensors element-wise, decode once.

Only for summable compressors (none, fp16, randk with a shared seed): their decode is linear and the
payload layout is the same on every rank, so decode(mean of payloads) = mean of decodes. A
`collective` compressor (PowerSGD) runs its own protocol of two allreduces instead, with its own
error feedback; that blocks until both rounds are done.
"""

from __future__ import annotations

from torch import Tensor

from compbench.comm.base import CommBase, CommTraits, encode
from compbench.compressors.base import Compressor
from compbench.engines.base import Engine, Handle
from compbench.memory.base import Memory
from compbench.stats import StepStats


class AllreduceComm(CommBase):
    traits = CommTraits(needs_summable=True, pattern="allreduce")

    def __init__(self, engine: Engine, compressor: Compressor, stats: StepStats) -> None:
        super().__init__(engine, compressor, stats)
        self.blocking = compressor.caps.collective

    def reduce(self, grad: Tensor, name: str, memory: Memory) -> Handle:
        if self.compressor.caps.collective:
            averaged, sent = self.compressor.compress_collective(  # type: ignore[attr-defined]
                grad, name, lambda t: self.engine.allreduce(t, name))
            self.book(sent)
            return Handle.done(averaged)
        if self.compressor.caps.identity:  # compat refuses a memory for it: nothing to compensate
            self.book(grad.numel() * grad.element_size())
            return self.engine.allreduce_inplace_async(grad, name)
        payload, ctx = encode(self.compressor, memory, grad, name, self.stats)
        self.book_payload(payload)
        handles = [self.engine.allreduce_async(t, f"{name}.{i}") for i, t in enumerate(payload)]

        def finish() -> Tensor:
            averaged = [h.wait() for h in handles]
            with self.stats.time("decompress"):
                return self.compressor.decompress(averaged, ctx)

        return Handle(finish)
