"""The machine a job's ranks share: whether they run on one (their boot id: one running kernel, one
monotonic clock), and how many cores other work took while they trained (the machine's busy CPU
time from /proc/stat less the job's own ranks' process CPU time, over the wall time): a load
average cannot tell a job's own communication threads from another job, this can.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from compbench.engines.base import Engine
from compbench.records import provenance

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")  # the same for every process of one running kernel


def _boot_id() -> str:
    return _BOOT_ID.read_text().strip() if _BOOT_ID.exists() else ""


def same_machine(engine: Engine) -> bool:
    """Whether every rank runs on rank 0's machine (a collective: every rank calls it)."""
    boot = _boot_id()
    first = engine.broadcast_object(boot if engine.rank == 0 else None, 0)
    mine = torch.tensor([float(bool(boot) and boot == first)])
    return engine.allreduce(mine, "machine.same", average=False).item() == engine.size


@dataclass(frozen=True)
class Mark:
    """The clocks at the start of training: wall, the machine's busy CPU, this rank's process CPU."""

    wall_s: float
    busy_s: float | None
    own_s: float

    @classmethod
    def now(cls) -> Mark:
        return cls(time.monotonic(), provenance.busy_seconds(), time.process_time())


def others_cores(engine: Engine, since: Mark) -> float | None:
    """Cores other work used on the average since `since` (on rank 0; None on the other ranks, where
    the ranks span machines, or without /proc/stat). A collective: every rank calls it."""
    mine = torch.tensor([os.getpid(), time.process_time() - since.own_s], dtype=torch.float64)
    if not same_machine(engine):
        return None
    gathered = engine.allgather([mine], "machine.cpu")
    # each process once: ranks that are threads of one process (tests) share its CPU time
    own = sum(dict((int(pid), cpu) for pid, cpu in (row[0].tolist() for row in gathered)).values())
    busy = provenance.busy_seconds()
    if engine.rank != 0 or busy is None or since.busy_s is None:
        return None
    wall = time.monotonic() - since.wall_s
    return max(0.0, busy - since.busy_s - own) / wall if wall > 0 else None
