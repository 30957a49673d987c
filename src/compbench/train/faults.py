"""Failures and slowness as configuration (the `fault` group): what a run injects into itself.

- kill: rank `kill_rank` kills its own process (SIGKILL: no clean-up, as a machine that loses power)
  at the start of step `at_step`, once per run; or, with `kill_prob` p, every worker but rank 0 dies
  at the start of each step with probability p (drawn from the run's seed, the step and the rank:
  the same seed gives the same failures). Under TorchElastic the worker's agent dies with it (the
  machine is gone, not just the process), unless `process_only` (its agent restarts it in place).
  Without `engine.elastic` the job then stops as any failed job does (the launcher names the rank;
  `resume=` continues from the last checkpoint); with it, the survivors continue from their last
  commit (compbench.train.elastic).
- rejoin: `rejoin_after_s` seconds after each kill a replacement worker joins (engine.elastic only:
  the launcher offers Horovod Elastic a new host, or starts a TorchElastic agent on one); or, with
  `rejoin_after_steps` d, once the survivors have committed d steps past the one the worker died at
  (rank 0 notes each committed step in RUN_DIR/faults.step for the launcher to read).
- straggler: rank `slow_rank` takes `slow_factor` times its compute time each step (it sleeps the
  difference inside the compute phase), so every collective waits for it.

Every injected kill is appended to RUN_DIR/faults.jsonl (one JSON object per line, written and
flushed before the process dies: the record survives the kill) and copied into results.json's
`faults` with the recoveries that followed it. The file also makes the kill happen once: survivors
that redo the step after a recovery, under new rank numbers, do not kill again (with kill_prob, a
step that saw a kill draws no more: one kill per step, unless two ranks draw it at the same moment).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from compbench.base.values import KeyRange
from compbench.records.fault_events import append_event, read_events

STEP_FILE = "faults.step"  # rank 0's last committed step (fault.rejoin_after_steps)


class FaultPlan:
    """The `fault` group's settings (conf/fault/*.yaml); built on every rank."""

    KEY_RANGES: ClassVar[dict[str, KeyRange]] = {
        "kill_rank": KeyRange(0, null="no worker is killed", what="the rank that kills itself"),
        "at_step": KeyRange(1, null="no worker is killed", what="the step at whose start it dies"),
        "rejoin_after_s": KeyRange(0, integer=False, null="no worker joins",
                                   what="seconds after the kill until a replacement joins"),
        "rejoin_after_steps": KeyRange(1, null="no worker joins",
                                       what="steps the survivors train after the kill until one joins"),
        "slow_rank": KeyRange(0, null="no straggler", what="the rank that computes slowly"),
        "slow_factor": KeyRange(1, integer=False, what="its compute time is this many times its own"),
        "kill_prob": KeyRange(0, 1, integer=False,
                              what="the chance that each worker but rank 0 dies at a step"),
    }

    def __init__(self, kill_rank: int | None = None, at_step: int | None = None,
                 rejoin_after_s: float | None = None, slow_rank: int | None = None,
                 slow_factor: float = 1.0, kill_prob: float = 0.0, process_only: bool = False,
                 rejoin_after_steps: int | None = None) -> None:
        self.kill_rank, self.at_step, self.rejoin_after_s = kill_rank, at_step, rejoin_after_s
        self.rejoin_after_steps = rejoin_after_steps
        self.slow_rank, self.slow_factor = slow_rank, float(slow_factor)
        self.kill_prob, self.process_only = float(kill_prob), bool(process_only)

    def check(self, np: int, elastic: bool, run_steps: tuple[int, str] | None, engine: str) -> None:
        """Config-time check against the job (ValueError of one line naming the fix); `run_steps`: how
        many steps the run takes and what bounds it, None where unknown here."""
        if self.process_only and not (self.kills and elastic and engine == "torch"):
            raise ValueError("fault.process_only=true kills a worker's process but not its machine, which "
                             "only TorchElastic tells apart (its agent restarts the worker in place; Horovod "
                             "Elastic takes the host out either way): use it with engine=torch "
                             "engine.elastic=true and fault.kill_rank or fault.kill_prob")
        if (self.kill_rank is None) != (self.at_step is None):
            raise ValueError("fault.kill_rank and fault.at_step go together (which worker dies, and at which "
                             "step); set both or neither")
        if self.kill_prob and self.kill_rank is not None:
            raise ValueError("fault.kill_prob and fault.kill_rank are two ways to kill workers; set one of "
                             "them")
        if self.kill_rank is not None and self.kill_rank >= np:
            raise ValueError(f"fault.kill_rank={self.kill_rank} is not a rank of engine.np={np} workers; "
                             f"pass fault.kill_rank from 0 to {np - 1}")
        if self.kill_rank == 0 and elastic and not self.process_only:
            raise ValueError("fault.kill_rank=0 with engine.elastic=true: rank 0 keeps the run's records "
                             "(TensorBoard, results.json) and its machine the rendezvous, and the survivors "
                             "must have them; kill another rank (fault.kill_rank=1), or only rank 0's "
                             "process (fault.process_only=true, engine=torch)")
        if self.at_step is not None and run_steps is not None and self.at_step >= run_steps[0]:
            raise ValueError(f"fault.at_step={self.at_step} is not before the run's end at step "
                             f"{run_steps[0]} ({run_steps[1]}): nothing would be killed; pass fault.at_step "
                             f"below {run_steps[0]}")
        if self.kill_prob and np < 2:
            raise ValueError(f"fault.kill_prob={self.kill_prob:g} kills workers other than rank 0 (which "
                             "keeps the records), and engine.np=1 has none; use engine.np=2 or more")
        if self.rejoin_after_s is not None and self.rejoin_after_steps is not None:
            raise ValueError("fault.rejoin_after_s and fault.rejoin_after_steps are two ways to say when a "
                             "replacement joins; set one of them")
        if self.rejoins and not (elastic and self.kills):
            key = "rejoin_after_s" if self.rejoin_after_s is not None else "rejoin_after_steps"
            raise ValueError(f"fault.{key} brings back a killed worker, which needs engine.elastic=true "
                             "and fault.kill_rank with fault.at_step, or fault.kill_prob")
        if self.slow_factor != 1 and self.slow_rank is None:
            raise ValueError(f"fault.slow_factor={self.slow_factor:g} slows the rank fault.slow_rank names, "
                             "and none is named; add fault.slow_rank=1 (or drop fault.slow_factor)")
        if self.slow_rank is not None and self.slow_rank >= np:
            raise ValueError(f"fault.slow_rank={self.slow_rank} is not a rank of engine.np={np} workers; "
                             f"pass fault.slow_rank from 0 to {np - 1}")

    @property
    def rejoins(self) -> bool:
        return self.rejoin_after_s is not None or self.rejoin_after_steps is not None

    def rejoin_due(self, run_dir: Path) -> Callable[[dict[str, Any]], bool]:
        """For the launcher: whether a replacement for this kill event may join now."""
        if self.rejoin_after_s is not None:
            after_s = self.rejoin_after_s
            return lambda kill: time.time() >= kill["time"] + after_s
        after = self.rejoin_after_steps or 0
        return lambda kill: committed_step(run_dir) >= kill["step"] - 1 + after

    def after_commit(self, step: int, rank: int, run_dir: Path) -> None:
        """Rank 0 notes the step it committed (a step-counted rejoin waits for it)."""
        if rank == 0 and self.rejoin_after_steps is not None:
            tmp = run_dir / f"{STEP_FILE}.tmp"
            tmp.write_text(str(step))
            os.replace(tmp, run_dir / STEP_FILE)

    @property
    def kills(self) -> bool:
        return self.kill_rank is not None or self.kill_prob > 0

    @property
    def injects(self) -> bool:
        """Any failure or slowness at all (the run then records `faults` in results.json)."""
        return self.kills or self.slow_rank is not None

    def before_step(self, step: int, rank: int, run_dir: Path, seed: int) -> None:
        """At the start of step `step` (0-based; `at_step` counts from 1): kill this process if due."""
        if self.kill_prob > 0:
            draw = random.Random(f"{seed}:{step}:{rank}").random()
            if rank == 0 or draw >= self.kill_prob or any(
                    e["event"] == "kill" and e["step"] == step + 1 for e in read_events(run_dir)):
                return
        elif self.kill_rank != rank or self.at_step != step + 1 or any(
                e["event"] == "kill" for e in read_events(run_dir)):
            return
        append_event(run_dir, {"event": "kill", "rank": rank, "step": step + 1, "time": time.time()})
        if os.environ.get("TORCHELASTIC_RUN_ID") and not self.process_only:  # the machine's TorchElastic
            os.kill(os.getppid(), signal.SIGKILL)  # agent goes too (else it restarts the worker in place)
        os.kill(os.getpid(), signal.SIGKILL)

    def straggle(self, rank: int, compute_s: float) -> None:
        """Inside the compute phase, after back-propagation: the straggler's extra time."""
        if rank == self.slow_rank and self.slow_factor > 1:
            time.sleep((self.slow_factor - 1) * compute_s)


def committed_step(run_dir: Path) -> int:
    """Rank 0's last committed step, as `after_commit` noted it; -1 before the first."""
    try:
        return int((run_dir / STEP_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return -1


def summary(recoveries: list[dict[str, Any]], workers_per_step: list[float], steps: int,
            workers: int) -> dict[str, Any]:
    """results.json's `summary.faults`: recoveries by kind, the seconds lost to them, and the steps
    trained at each world size (`elastic/workers` per step where recorded, else every step at
    `workers`)."""
    by_kind = {kind: sum(r["kind"] == kind for r in recoveries) for kind in ("failure", "join", "restart")}
    counts: dict[str, int] = {}
    for w in workers_per_step or [workers] * steps:
        counts[str(int(w))] = counts.get(str(int(w)), 0) + 1
    return {**by_kind, "lost_s": round(sum(float(r.get("lost_s") or 0.0) for r in recoveries), 3),
            "steps_by_workers": counts}
