"""The machine a job's ranks share: whether they run on one (their boot id: one running kernel, one
monotonic clock), and what other work did there while they trained (`Watch`): how many tasks of
other processes were runnable on the average (/proc/stat's runnable tasks less the job's own
runnable threads, sampled twice a second: other work's demand for the cores), and how many cores
it used (the machine's busy CPU time less the job's ranks' process CPU time). A load average
cannot tell a job's own communication threads from another job; these can. A job whose workers
run first on the cores (nice -20) keeps most of them from the others, who then use little CPU but
stay runnable: the demand says the machine was shared, the cores how much of it the others got.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from compbench.engines.base import Engine
from compbench.records import provenance

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")  # the same for every process of one running kernel
SAMPLE_S = 0.5  # between two counts of the runnable tasks


def _boot_id() -> str:
    return _BOOT_ID.read_text().strip() if _BOOT_ID.exists() else ""


def same_machine(engine: Engine) -> bool:
    """Whether every rank runs on rank 0's machine (a collective: every rank calls it)."""
    boot = _boot_id()
    first = engine.broadcast_object(boot if engine.rank == 0 else None, 0)
    mine = torch.tensor([float(bool(boot) and boot == first)], device=engine.device)
    return engine.allreduce(mine, "machine.same", average=False).item() == engine.size


@dataclass(frozen=True)
class Others:
    """Other work while the job trained: runnable tasks and cores used, on the average."""

    runnable: float | None
    cores: float | None


class Watch:
    """Started when training starts and finished when it ends, by every rank (collectives); rank 0
    keeps the record."""

    def __init__(self, engine: Engine) -> None:
        self.shared = same_machine(engine)
        self.wall_s, self.own_s = time.monotonic(), time.process_time()
        self.busy_s = provenance.busy_seconds()
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not self.shared:
            return
        pids = engine.allgather([torch.tensor([os.getpid()], dtype=torch.int64, device=engine.device)],
                                 "machine.pids")
        if engine.rank == 0 and provenance.runnable_tasks() is not None:
            self.pids = sorted({int(row[0].item()) for row in pids})  # ranks that are threads share one
            self._thread = threading.Thread(target=self._sample, name="compbench-machine-watch", daemon=True)
            self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._count()

    def _count(self) -> None:
        runnable = provenance.runnable_tasks() or 0
        self.samples.append(max(0, runnable - sum(provenance.running_threads(p) for p in self.pids)))

    def finish(self, engine: Engine) -> Others:
        """What other work did meanwhile (rank 0's; empty on the others and across machines)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            if not self.samples:  # trained for less than a sample's interval: one count now
                self._count()
        if not self.shared:
            return Others(None, None)
        mine = torch.tensor([os.getpid(), time.process_time() - self.own_s], dtype=torch.float64,
                            device=engine.device)
        gathered = engine.allgather([mine], "machine.cpu")
        if engine.rank != 0:
            return Others(None, None)
        # each process once: ranks that are threads of one process (tests) share its CPU time
        own = sum(dict((int(pid), cpu) for pid, cpu in (row[0].tolist() for row in gathered)).values())
        busy, wall = provenance.busy_seconds(), time.monotonic() - self.wall_s
        cores = None
        if busy is not None and self.busy_s is not None and wall > 0:
            cores = max(0.0, busy - self.busy_s - own) / wall
        runnable = sum(self.samples) / len(self.samples) if self.samples else None
        return Others(runnable, cores)
