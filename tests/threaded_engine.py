"""An in-process multi-rank engine: N ranks as N threads of one process, every collective a
rendezvous of all of them. Real collectives' semantics (averaging, uneven allgather, all-to-all,
ring hops through `EngineBase.shift`) without processes, so that a test can train every
combination for a few steps quickly. Collectives complete when issued (handles are already done)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from compbench.engines.base import EngineBase, Handle


class ThreadWorld:
    """The shared rendezvous of `size` ranks: `exchange` is an all-gather of Python objects."""

    def __init__(self, size: int, local_size: int | None = None, device: torch.device | str = "cpu") -> None:
        """`local_size` ranks per emulated node (consecutive ranks; default: one node); `device`: every
        rank's (scripts/gpu_check.py trains on a GPU through it)."""
        self.size, self.local_size, self.device = size, local_size or size, torch.device(device)
        self.barrier = threading.Barrier(size, timeout=120)
        self.slots: list[Any] = [None] * size

    def exchange(self, rank: int, obj: Any) -> list[Any]:
        self.slots[rank] = obj
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()  # everyone has read this round before anyone writes the next
        return out

    def run(self, fn: Callable[[ThreadEngine], Any], name: str = "torch") -> list[Any]:
        """fn(engine) on every rank, each in its own thread; the results in rank order. The first
        exception of any rank is raised (the others are released by breaking the barrier)."""
        results: list[Any] = [None] * self.size
        errors: list[BaseException] = []

        def body(rank: int) -> None:
            try:
                results[rank] = fn(ThreadEngine(self, rank, name))
            except BaseException as e:  # noqa: B036 - re-raised in the calling thread
                errors.append(e)
                self.barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
        if real or errors:
            raise (real or errors)[0]
        return results


class ThreadEngine(EngineBase):
    backend = "threads"

    def __init__(self, world: ThreadWorld, rank: int, name: str) -> None:
        self.world, self.rank, self.size, self.name = world, rank, world.size, name
        self.local_rank, self.local_size = rank % world.local_size, world.local_size
        self.device = world.device

    def _all(self, obj: Any) -> list[Any]:
        return self.world.exchange(self.rank, obj)

    def allreduce_async(self, t: Tensor, name: str, average: bool = True) -> Handle:
        total = torch.stack(self._all(t.detach().clone())).sum(0)
        return Handle.done(total.div_(self.size) if average else total)

    def allgather_async(self, tensors: list[Tensor], name: str) -> Handle:
        return Handle.done(self._all([t.detach().clone() for t in tensors]))

    def alltoall(self, t: Tensor, splits: list[int], name: str,
                 received: list[int] | None = None) -> tuple[Tensor, list[int]]:
        chunks = self._all([c.clone() for c in t.split(splits)])
        mine = [chunks[src][self.rank] for src in range(self.size)]
        return torch.cat(mine), [len(c) for c in mine]

    def broadcast_(self, t: Tensor, root: int = 0, name: str = "bcast") -> Tensor:
        t.copy_(self._all(t.detach().clone())[root])
        return t

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        return self._all(obj)[root]

    def barrier(self) -> None:
        self._all(None)

    def shutdown(self) -> None:
        pass


def count_collectives_per_step(engine: ThreadEngine, trainer) -> list[int]:
    """Counts every collective of `engine` (one exchange each) into the step it belongs to, from the
    first step's start to the end of the training loop (the machine watch and the skew record,
    collectives before the first step and after the last, are not a step's); returns the list the
    counts go into while `trainer.fit()` runs."""
    per_step: list[int] = []
    counting = [True]
    exchange, begin_step = engine._all, trainer.sync.begin_step
    after_loop = trainer.record_waits_for_last_rank

    def counted(obj):
        if per_step and counting[0]:
            per_step[-1] += 1
        return exchange(obj)

    def begin(step, epoch):
        per_step.append(0)
        begin_step(step, epoch)

    def stop():
        counting[0] = False
        after_loop()

    engine._all, trainer.sync.begin_step, trainer.record_waits_for_last_rank = counted, begin, stop
    return per_step
