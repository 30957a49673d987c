"""`comm=allreduce`: average the payload tensors element-wise, decode once.

Only for summable compressors (none, fp16, randk with a shared seed, powersgd): their decode is linear
and the payload layout is the same on every rank, so decode(mean of payloads) = mean of decodes.
PowerSGD runs its own two-allreduce protocol (`compress_collective`).
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
        # PowerSGD interleaves computation with two allreduces and keeps its own error feedback:
        # the pipeline hands it the raw gradient (`reduce_tensor`) and waits.
        self.blocking = hasattr(compressor, "compress_collective")

    def reduce_tensor(self, x: Tensor, name: str, memory: object) -> tuple[Tensor, int]:
        return self.compressor.compress_collective(x, name, lambda t: self.engine.allreduce(t, name))  # type: ignore[attr-defined]

    def start(self, payload: list[Tensor], ctx: Ctx) -> Handle:
        handles = [self.engine.allreduce_async(t, f"{ctx.name}.{i}") for i, t in enumerate(payload)]
        return Handle(lambda: (ctx, [h.wait() for h in handles]))

    def wait(self, handle: Handle) -> Tensor:
        ctx, averaged = handle.wait()
        with self.stats.time("decompress"):
            return self.compressor.decompress(averaged, ctx)
