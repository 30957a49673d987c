"""The compression seam in plain sight: memory -> compressor -> communicator -> averaged gradient.

`submit` starts one tensor (or fused group) on its way as soon as the scheduler hands it over;
`collect` waits for all of them in submission order and returns the averaged dense gradients.
Every rank submits the same names in the same order (the collectives must match).
"""

from __future__ import annotations

import time

from torch import Tensor

from compbench.comm.allreduce import AllreduceComm
from compbench.compressors.base import Compressor, make_ctx, payload_nbytes
from compbench.compressors.none import NoCompression
from compbench.engines.base import Engine, Handle
from compbench.memory.base import Memory
from compbench.train.metrics import StepStats
from compbench.train.selection import Selection


class GradientPipeline:
    def __init__(self, engine: Engine, compressor: Compressor, memory: Memory, comm, selection: Selection,
                 stats: StepStats) -> None:
        self.engine, self.compressor, self.memory, self.comm = engine, compressor, memory, comm
        self.selection, self.stats = selection, stats
        self.dense = AllreduceComm(engine, NoCompression(), stats)
        self.step = 0
        self._pending: list[tuple[str, object, Handle]] = []

    def begin_step(self, step: int, epoch: float) -> None:
        self.step = step
        self.compressor.begin_step(step, epoch)  # type: ignore[attr-defined]

    def submit(self, name: str, grad: Tensor) -> None:
        self.stats.bytes_dense += grad.numel() * 4
        if self.comm.blocking and self.selection.compresses(grad, self.step):
            with self.stats.time("comm"):
                averaged, sent = self.comm.reduce_tensor(grad, name, self.memory)
            self.stats.bytes_sent += sent
            self._pending.append((name, _Done(), Handle(lambda: averaged)))
            return
        if not self.selection.compresses(grad, self.step):
            payload, ctx = [grad.reshape(-1)], make_ctx(grad, name)
            comm = self.dense
        else:
            with self.stats.time("compress"):
                x = self.memory.compensate(grad, name)
                payload, ctx = self.compressor.compress(x, name)
                self.memory.update(x, name, self.compressor, payload, ctx)
            comm = self.comm
        self.stats.bytes_sent += payload_nbytes(payload)
        with self.stats.time("comm"):
            self._pending.append((name, comm, comm.start(payload, ctx)))

    def collect(self) -> list[tuple[str, Tensor]]:
        """Wait for every submitted group (in submission order); call after back-propagation."""
        t_collect = time.perf_counter()
        out = []
        for name, comm, handle in self._pending:
            decode_before = self.stats.ms["decompress"]
            t0 = time.perf_counter()
            averaged = comm.wait(handle)
            # Waiting includes the decode, which is booked separately.
            self.stats.add_ms("comm", (time.perf_counter() - t0) * 1e3 - (self.stats.ms["decompress"] - decode_before))
            out.append((name, averaged))
        self._pending.clear()
        self.stats.add_ms("comm_exposed", (time.perf_counter() - t_collect) * 1e3)
        return out


class _Done:
    """A communicator stand-in for work that already finished."""

    @staticmethod
    def wait(handle: Handle) -> Tensor:
        return handle.wait()
