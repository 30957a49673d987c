"""`comm=allreduce`: average the payload tensors element-wise, decode once.

Only for summable compressors (none, fp16, randk with a shared seed, powersgd): their decode is linear
and the payload layout is the same on every rank, so decode(mean of payloads) = mean of decodes.
"""

from __future__ import annotations

from torch import Tensor

from compbench.compressors.base import Compressor, Ctx
from compbench.engines.base import Engine, Handle
from compbench.train.metrics import StepStats


class AllreduceComm:
    requires_summable = True

    def __init__(self, engine: Engine, compressor: Compressor, stats: StepStats) -> None:
        self.engine, self.compressor, self.stats = engine, compressor, stats

    def start(self, payload: list[Tensor], ctx: Ctx) -> Handle:
        handles = [self.engine.allreduce_async(t, f"{ctx.name}.{i}") for i, t in enumerate(payload)]
        return Handle(lambda: (ctx, [h.wait() for h in handles]))

    def wait(self, handle: Handle) -> Tensor:
        ctx, averaged = handle.wait()
        with self.stats.time("decompress"):
            return self.compressor.decompress(averaged, ctx)
