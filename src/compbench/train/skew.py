"""How long rank 0 waited at each step's exchange for the last rank to get there (`time/comm_skew_ms`,
summary `comm_skew_ms`): a part of its exposed communication that is not the wire's nor the
collective's but the ranks' different speeds (one rank's step took longer, or was descheduled).

Each rank notes when its step first waited on an exchange (compbench.records.stats.StepStats.arrived:
CLOCK_MONOTONIC, the one clock every process of one machine shares); at the end of training the
ranks gather their arrivals, and for every step rank 0's wait for the last one is the latest arrival
less its own, at most its exposed communication. Ranks on different machines (a different boot id)
share no clock: nothing is recorded. The ranks of a local job and of `compbench cluster`'s emulated
nodes run on one machine.
"""

from __future__ import annotations

import math

import torch

from compbench.engines.base import Engine
from compbench.train.machine import same_machine


def waits_for_last_rank_ms(engine: Engine, arrivals: list[float], exposed_ms: list[float] | None
                           ) -> list[float] | None:
    """Per step, rank 0's wait for the last rank to arrive (ms, in [0, its exposed communication]),
    on rank 0; None on the other ranks and where the ranks share no clock. A collective: every rank
    calls it with its arrivals (NaN: the step did not wait on an exchange), as many as its steps;
    `exposed_ms`: rank 0's exposed communication per step."""
    if not same_machine(engine):
        return None
    gathered = engine.allgather([torch.tensor(arrivals, dtype=torch.float64, device=engine.device)],
                                "skew.arrivals")
    if engine.rank != 0 or exposed_ms is None:
        return None
    mine, others = gathered[0][0].tolist(), [row[0].tolist() for row in gathered]
    waits = []
    for i, own in enumerate(mine):
        last = max(ranks[i] for ranks in others)
        exposed = exposed_ms[i] if i < len(exposed_ms) else 0.0
        late_ms = 0.0 if math.isnan(own) or math.isnan(last) else (last - own) * 1e3
        waits.append(min(exposed, max(0.0, late_ms)))
    return waits
