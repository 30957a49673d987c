"""`comm=allgather`: every rank receives every rank's payload (sizes may differ), decodes all of
them and averages. Works for any compressor; the only choice for rank-dependent sparse indices."""

from __future__ import annotations

from torch import Tensor

from compbench.compressors.base import Compressor, Ctx
from compbench.engines.base import Engine, Handle
from compbench.train.metrics import StepStats


class AllgatherComm:
    requires_summable = False
    blocking = False

    def __init__(self, engine: Engine, compressor: Compressor, stats: StepStats) -> None:
        self.engine, self.compressor, self.stats = engine, compressor, stats

    def start(self, payload: list[Tensor], ctx: Ctx) -> Handle:
        h = self.engine.allgather_async(payload, ctx.name)
        return Handle(lambda: (ctx, h.wait()))

    def wait(self, handle: Handle) -> Tensor:
        ctx, payloads = handle.wait()
        with self.stats.time("decompress"):
            return self.compressor.decompress_all(payloads, ctx)
