"""`comm=allreduce`: average the payload tensors element-wise, decode once.

Only for summable compressors (none, fp16, randk with a shared seed): their decode is linear and the
payload layout is the same on every rank, so decode(mean of payloads) = mean of decodes. A
`collective` compressor (PowerSGD) runs its own protocol of two allreduces instead, with its own
error feedback; that blocks until both rounds are done.
`reduce_many` (scheduler=bucket, DiLoCo's outer exchange) averages several tensors' payloads as one
flat buffer per payload dtype: one allreduce each, instead of one per payload tensor.
"""

from __future__ import annotations

from torch import Tensor

from compbench.codec.base import Compressor, is_collective
from compbench.comm.base import CommBase, CommTraits, encode
from compbench.engines.base import Engine, Handle, flat_average
from compbench.memory.base import Memory
from compbench.records.stats import StepStats


class AllreduceComm(CommBase):
    traits = CommTraits(needs_summable=True, pattern="allreduce", packs=True)

    def __init__(self, engine: Engine, compressor: Compressor, stats: StepStats) -> None:
        super().__init__(engine, compressor, stats)
        self.blocking = compressor.caps.collective

    def reduce(self, grad: Tensor, name: str, memory: Memory) -> Handle:
        if is_collective(self.compressor):
            averaged, sent = self.compressor.compress_collective(
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

    def reduce_many(self, name: str, items: list[tuple[str, Tensor]], memory: Memory) -> Handle:
        assert not self.compressor.caps.collective, "comm.base.packs: a collective protocol is not packed"
        if self.compressor.caps.identity:  # the gradients themselves, as one flat buffer per dtype
            grads = [grad for _, grad in items]
            self.book(sum(g.numel() * g.element_size() for g in grads))
            return flat_average(self.engine, name, grads)
        encoded = [encode(self.compressor, memory, grad, item, self.stats) for item, grad in items]
        payload = [t for p, _ in encoded for t in p]
        self.book_payload(payload)

        def decode(averaged: list[Tensor]) -> list[Tensor]:
            out, pos = [], 0
            with self.stats.time("decompress"):
                for p, ctx in encoded:
                    out.append(self.compressor.decompress(averaged[pos : pos + len(p)], ctx))
                    pos += len(p)
            return out

        averaged = flat_average(self.engine, name, payload)
        return Handle(lambda: decode(averaged.wait()))

