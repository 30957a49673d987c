"""engine.elastic=true on engine=horovod: training that goes on when workers fail or join, on Horovod
Elastic.

Horovod's own machinery does the membership: its driver (horovodrun with --min-np/--max-np and a
host discovery script; compbench.launch.elastic starts it on one machine) notices a worker that
died or a host that appeared, and every worker's `hvd.elastic.run` loop catches the failed
collective (HorovodInternalError) or the notice (HostsUpdatedInterrupt), shuts Horovod down and
joins the new world, in the same process. This module is the state that loop keeps (an
`hvd.elastic.State`; the commit and the recovery are compbench.train.elastic's):

- commit (`save`): at the end of every round, a copy in memory of the trainer's state and of this
  rank's own.
- restore: after a failure, everything since the last commit is dropped (a per-step method drops
  the failed step; a local-update method redoes the round with the workers that are left).
- sync: the lowest rank that holds a commit hands its shared state, and its own for a joiner, to
  every rank.
- reset: the trainer is built again for the new world (data shards, collectives, process sets) and
  loads the commit. Rank 0's recorder (TensorBoard, the history behind results.json) is kept across
  the rebuilds, its history cut back to the commit (the steps since are redone).

Rank 0 keeps the run's records and must survive (compbench.train.faults refuses to kill it).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from horovod.common.elastic import State
from omegaconf import DictConfig

from compbench.train.checkpoint import on_device
from compbench.train.elastic import copy_state, restore_commit, take_commit
from compbench.train.loop import Trainer
from compbench.train.metrics import Recorder


def run_horovod_elastic(cfg: DictConfig, engine, run_dir: Path) -> dict[str, Any] | None:
    """Train under `hvd.elastic.run` until done; rank 0's results."""
    import horovod.torch as hvd

    state = ElasticState(cfg, engine, run_dir)

    @hvd.elastic.run
    def train(state: ElasticState) -> dict[str, Any] | None:
        return state.fit()

    return train(state)


class ElasticState(State):
    """The trainer and its last commit, across Horovod Elastic's resets."""

    def __init__(self, cfg: DictConfig, engine, run_dir: Path) -> None:
        super().__init__(bcast_object=engine.hvd.broadcast_object, get_rank=engine.hvd.rank)
        self.cfg, self.engine, self.run_dir = cfg, engine, run_dir
        self.trainer: Trainer | None = None
        self.shared: dict[str, Any] | None = None  # the last commit: what every rank holds alike
        self.mine: dict[str, Any] | None = None  # and this rank's own (None: this worker just joined)
        self.mine_step = -1  # the step of this rank's own commit
        self.peer: dict[str, Any] | None = None  # the commit's source rank's own, for a joiner
        self.committed_at = 0.0
        self._position: tuple[int, int] | None = None  # where the trainer continues after the commit
        self.history: dict[str, int] = {}  # rank 0: the recorder's history length at the commit
        self.recorder: Recorder | None = None  # rank 0's, kept across rebuilds
        self.recoveries: list[dict[str, Any]] = []

    # -- Horovod's State interface ------------------------------------------------------------------

    def save(self) -> None:
        """Called by `commit`: keep a copy of the trainer's state (at a round's end)."""
        trainer = self.trainer
        assert trainer is not None and self._position is not None
        self.shared, self.mine = take_commit(trainer, *self._position)
        self.mine_step = trainer.step
        self.committed_at = time.perf_counter()
        if trainer.recorder is not None:
            self.history = {tag: len(values) for tag, values in trainer.recorder.history.items()}

    def restore(self) -> None:
        """After a failure: nothing to undo here; `reset` drops the trainer, built again from the last
        commit."""

    def sync(self) -> None:
        """Every rank (joiners too) takes the last commit of the lowest rank that has one."""
        hvd = self.engine.hvd
        have = torch.tensor([self.engine.rank if self.shared is not None else self.engine.size])
        source = int(hvd.allreduce(have, name="elastic.source", op=hvd.Min).item())
        if source == self.engine.size:
            return  # the start: nobody has committed yet
        # through host memory: a tensor pickled on the source's GPU would land on that GPU's index here
        shared, mine = on_device(self.shared, "cpu"), on_device(self.mine, "cpu")
        self.shared = hvd.broadcast_object(shared, root_rank=source, name="elastic.shared")
        self.peer = hvd.broadcast_object(mine, root_rank=source, name="elastic.peer")

    def reset(self) -> None:
        """After Horovod joined the new world (a worker failed, or hosts were added or removed): read
        this rank's place in it; the trainer is built again for it from the last commit."""
        self.engine.refresh()
        self.trainer = None

    # -- training ---------------------------------------------------------------------------------

    def commit_at(self, epoch: int, batch: int) -> None:
        self._position = (epoch, batch)
        self.commit()  # save, then Horovod's check for hosts that appeared (HostsUpdatedInterrupt)

    def fit(self) -> dict[str, Any] | None:
        if self.trainer is None:
            self.trainer = self._build()
        return self.trainer.fit()

    def _build(self) -> Trainer:
        trainer = Trainer(self.cfg, self.engine, self.run_dir, recorder=self.recorder)
        self.recorder = trainer.recorder
        trainer.on_commit = self.commit_at
        trainer.recoveries = self.recoveries
        if self.shared is not None:
            self._restore(trainer)
        return trainer

    def _restore(self, trainer: Trainer) -> None:
        """Load the last commit into a trainer built for the new world; record the recovery."""
        assert self.shared is not None
        engine = self.engine
        # A survivor whose own commit is not the source's (the failure came between their commits)
        # starts as a joiner does.
        mine = self.mine if self.mine is not None and self.mine_step == self.shared["step"] else None
        # Every rank adds the same cost to its clock: rank 0's (a survivor: it has committed).
        mine_s = time.perf_counter() - self.committed_at if engine.rank == 0 else None
        lost_s = float(engine.hvd.broadcast_object(mine_s, root_rank=0, name="elastic.lost"))
        if trainer.recorder is not None:
            for tag, values in trainer.recorder.history.items():  # steps since the commit are redone
                del values[self.history.get(tag, 0):]
        record = restore_commit(trainer, copy_state(self.shared), copy_state(mine), copy_state(self.peer),
                                lost_s)
        if trainer.recorder is not None:
            self.recoveries.append(record)
