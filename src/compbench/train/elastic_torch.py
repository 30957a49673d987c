"""engine.elastic=true on engine=torch: training that goes on when workers fail or join, on TorchElastic.

TorchElastic does the membership: one agent per machine (`torchrun --nnodes=1:N --rdzv-backend=c10d`;
compbench.launch.elastic starts them on one machine) restarts its worker when the worker fails, or
when an agent waits to join, after a new rendezvous of the agents that are left. Every worker of the
new world is a new process: whatever it continues from must be on disk. So the commit (compbench.train.
elastic: at each round's end, the trainer's state and this rank's own) is written to
RUN_DIR/elastic/NODE.pt, one file per machine (the one before kept as NODE.prev.pt), by a background
thread from a copy (training goes on while it is written; the next commit waits for it); rank 0's
also holds its records (the history behind results.json and the recoveries so far), since its
recorder starts anew with the process. A file written by another job (another rendezvous id) is
ignored.

At every start, each rank reads its machine's files; the ranks agree on the newest commit step that
all of them hold (a worker that died while writing one holds the one before), and the lowest rank
holding it hands its shared state to every rank and its own state to those that need it
(compbench.train.elastic.restore_commit); rank 0 takes the records of the rank that was rank
0 at the commit. A worker killed between two commits is a failure, a new agent a join: TorchElastic
stops every worker at that moment, so the work since the last commit is redone in both cases (in the
recovery's `lost_s`).

A worker that loses a peer says so in one line and exits (PEER_LOST_EXIT) for its agent to restart
it. Below engine.min_np workers, every survivor stops with the checkpoint and the one line, rank 0
records the failure in results.json, and they exit 0: TorchElastic ends the job instead of restarting
its workers (compbench's launcher then exits 1 with the line).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from compbench.base.errors import PEER_LOST_EXIT, as_peer_lost, say_error
from compbench.launch.processes import NODE_ENV, die_with_parent
from compbench.train.checkpoint import load_safely, on_device
from compbench.train.elastic import BelowMinimum, restore_commit, take_commit
from compbench.train.loop import Trainer

FOLDER = "elastic"


def run_torch_elastic(cfg: DictConfig, engine, run_dir: Path) -> dict[str, Any] | None:
    """Train this world's part of the run under TorchElastic; rank 0's results."""
    die_with_parent(os.getppid())  # its agent: a machine that is gone takes its worker along
    try:
        return _train(cfg, engine, run_dir)
    except BelowMinimum as e:
        say_error(str(e))
        if engine.rank == 0:
            from compbench.records.rundir import record_failure

            record_failure(run_dir, cfg, str(e))
        engine.shutdown()
        return None
    except Exception as e:
        if as_peer_lost(e) is None:  # the launcher ends the job at this line (the agent would restart it)
            say_error(f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e))
            raise
        # Nothing to unwind: the commits are on disk, and the agent starts this worker again.
        print(f"compbench: rank {engine.rank}: a worker is gone; TorchElastic restarts the workers",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(PEER_LOST_EXIT)


def _train(cfg: DictConfig, engine, run_dir: Path) -> dict[str, Any] | None:
    file = CommitFile(run_dir / FOLDER / f"{node_name()}.pt", os.environ.get("TORCHELASTIC_RUN_ID", ""))
    saved = file.read()
    trainer = Trainer(cfg, engine, run_dir)
    step, source, recorder = _agree(engine, saved)
    if step >= 0:
        _recover(trainer, saved.get(step), source, recorder)
    else:
        trainer.start_at = trainer.resume_position()  # the start, or resume='s checkpoint
    # At once: a failure before the first round's end is then a recovery from the start, and one after
    # a recovery starts from this world (its size, the recovery in the records), not the one before.
    assert trainer.start_at is not None
    file.write(_commit(trainer, *trainer.start_at))
    trainer.on_commit = lambda epoch, batch: file.write(_commit(trainer, epoch, batch))
    results = trainer.fit()
    file.wait()
    return results


def _agree(engine, saved: dict[int, dict[str, Any]]) -> tuple[int, int, int | None]:
    """In one allgather of every rank's two newest commit steps (and whether each holds rank 0's
    records): the step to continue from, the newest commit that every rank holding commits holds (a
    rank killed while its last commit was being written holds the one before; the others keep two
    and go back to it, each with its own state of that step), -1 at the start; the lowest rank that
    holds it; and the one whose commit of it holds the records of the rank that was rank 0 then."""
    newest = sorted(saved, reverse=True)[:2] + [-1, -1]
    steps = newest[:2]
    records = [int(s in saved and "records" in saved[s]) for s in steps]
    rows = [h[0].tolist() for h in engine.allgather([torch.tensor([*steps, *records])], "elastic.commits")]
    held = [set(row[:2]) - {-1} for row in rows]
    holders = [h for h in held if h]
    if not holders:
        return -1, 0, None
    # None in common (not seen: a rank is at most one commit behind): the newest, whose holder's own
    # state the others take as a joiner does
    step = max(set.intersection(*holders) or set.union(*holders))
    source = next(r for r, h in enumerate(held) if step in h)
    recorder = next((r for r, row in enumerate(rows) if any(row[i] == step and row[2 + i] for i in range(2))),
                    None)
    return step, source, recorder


def _recover(trainer: Trainer, saved: dict[str, Any] | None, source: int, recorder: int | None) -> None:
    """Load the newest commit (`saved`: this rank's file when it holds that commit) into `trainer`;
    `source` holds it, `recorder` was rank 0 at it."""
    engine = trainer.engine

    def held_by(rank: int, key: str) -> Any:  # `key` of `rank`'s commit, on every rank
        mine = saved[key] if saved is not None and engine.rank == rank else None
        return engine.broadcast_object(on_device(mine, "cpu"), rank)  # through host memory

    shared, peer = held_by(source, "shared"), held_by(source, "mine")
    # the same on every rank: the source's
    since = time.time() - saved["time"] if saved is not None and engine.rank == source else None
    lost_s = float(engine.broadcast_object(since, source))
    # rank 0's records at the commit (its recorder starts anew with the process)
    records = held_by(recorder, "records") if recorder is not None else None
    record = restore_commit(trainer, shared, saved["mine"] if saved is not None else None, peer, lost_s)
    if trainer.recorder is not None:
        if records is not None:
            trainer.recorder.history.update({tag: list(v) for tag, v in records["history"].items()})
            trainer.recoveries.extend(records["recoveries"])
        trainer.recoveries.append(record)


def _commit(trainer: Trainer, epoch: int, batch: int) -> dict[str, Any]:
    shared, mine = take_commit(trainer, epoch, batch)
    commit = {"step": trainer.step, "time": time.time(), "shared": shared, "mine": mine}
    if trainer.recorder is not None:
        commit["records"] = {"history": {tag: list(v) for tag, v in trainer.recorder.history.items()},
                             "recoveries": list(trainer.recoveries)}
    return commit


def node_name() -> str:
    """This machine's name among the job's (its commit file's): the one compbench's launcher gives
    each agent, else the host name and the worker's local rank."""
    return os.environ.get(NODE_ENV) or f"{socket.gethostname()}-{os.environ.get('LOCAL_RANK', '0')}"


class CommitFile:
    """One machine's last two commits on disk (`NODE.pt` and `NODE.prev.pt`), written by a background
    thread: the new one to a tmp file, the last one renamed to `prev`, the tmp file renamed in its
    place. A worker killed while writing leaves its two commits before whole."""

    def __init__(self, path: Path, job: str) -> None:
        self.path, self.job = path, job
        self.prev = path.with_suffix(".prev.pt")
        self._writer: threading.Thread | None = None

    def read(self) -> dict[int, dict[str, Any]]:
        """This job's commits here, by step."""
        found = {}
        for path in (self.path, self.prev):
            try:  # onto the CPU: the restore maps it to the rank's device
                saved = load_safely(path, "engine.elastic", fix="remove it (the run then continues from its "
                                    "other commit, or from the start)")
            except FileNotFoundError:
                continue
            if not isinstance(saved, dict) or "step" not in saved:
                raise ValueError(f"engine.elastic: {path} is not a commit of this run's machine; remove it")
            if saved.get("job") == self.job:
                found[int(saved["step"])] = saved
        return found

    def write(self, commit: dict[str, Any]) -> None:
        self.wait()
        self._writer = threading.Thread(target=self._save, args=({**commit, "job": self.job},), daemon=True)
        self._writer.start()

    def wait(self) -> None:
        if self._writer is not None:
            self._writer.join()
            self._writer = None

    def _save(self, commit: dict[str, Any]) -> None:
        self.path.parent.mkdir(exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        torch.save(commit, tmp)
        if self.path.exists():
            os.replace(self.path, self.prev)
        os.replace(tmp, self.path)
