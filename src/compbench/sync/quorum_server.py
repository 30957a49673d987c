"""The synchronizer of `sync=quorum_diloco` as threads on rank 0, and the learners' side of its wire.

Point to point over torch.distributed (gloo, host tensors), on two process groups of their own made
by every rank at setup (`new_group` is collective): gloo's groups must not be shared between
threads, and here each is used by one thread per process:
- `deliveries`: learners 1..N-1 send from their training thread; rank 0's receiver thread takes
  them from any source (gloo receives from any sender: `irecv` with no source).
- `replies`: rank 0's synchronizer thread sends θ; learners 1..N-1 receive it in their training
  thread.
Rank 0's own learner talks to the synchronizer through in-process queues (a process cannot send to
itself).

Messages (host tensors): a delivery is a header int64[HEADER] = (kind, base version, steps, tokens,
compute microseconds) with tag _TAG_HEAD, then, for a delivery, the outer gradient Δ flat (the
parameters' dtype) with tag _TAG_BODY from the same sender; kind LEAVE has no body. A reply is
int64[2] (θ's version, the stop: 1 once rank 0's training ended), then θ flat. Gloo keeps the order
of one sender's messages of one tag.

The stop: rank 0's learner, its training over (its target, budget or max_steps), submits `Stop`
(compbench.sync.quorum_diloco's `stop_learners`, called by the trainer before the collectives that
follow training); the synchronizer answers the learners waiting for a merge at once, and every
later delivery, with the stop flag (compbench.sync.quorum_merge's rules). A learner told to stop
ends its training there and leaves as at the end (LEAVE), after the trainer's final checkpoint.

The synchronizer thread applies compbench.sync.quorum_merge.QuorumState's rules: it waits for the
next delivery at most until the pending merge's window closes, merges when due, and answers the
learners. It stops when every learner has left (compbench.sync.quorum_diloco's `drain` at the
end of training); the receiver thread stops when every remote learner has. A failure in either
thread is kept and raised in rank 0's training thread at its next exchange; remote learners then
see their receive time out (engine.timeout_s).
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from compbench.sync.quorum_merge import Contribution, QuorumState
from compbench.sync.server_threads import ServerThreads

DELIVER, LEAVE = 1, 2
HEADER = 5
HOST = "cpu"  # gloo's point to point carries host tensors: every message is built on the host
_TAG_HEAD, _TAG_BODY, _TAG_REPLY, _TAG_THETA = 21, 22, 23, 24


@dataclass
class Leave:
    rank: int


@dataclass
class Stop:
    """Rank 0's training ended: the other learners stop at their next delivery."""


def header(kind: int, base: int, steps: int, tokens: int, compute_s: float) -> Tensor:
    return torch.tensor([kind, base, steps, tokens, round(compute_s * 1e6)], dtype=torch.int64, device=HOST)


class QuorumServer(ServerThreads[Contribution | Leave | Stop, tuple[int, Tensor]]):
    """Rank 0's synchronizer: `submit` (rank 0's learner) and the receiver thread feed one queue of
    events; the synchronizer thread owns `state` (under `lock` for checkpoints) and replies to rank
    0's learner through `mine` (compbench.sync.server_threads)."""

    def __init__(self, state: QuorumState, learners: int, numel: int, dtype: torch.dtype,
                 deliveries: Any, replies: Any) -> None:
        self.state, self.learners, self.numel, self.dtype = state, learners, numel, dtype
        self.deliveries, self.replies = deliveries, replies
        now = time.monotonic()
        for rank in range(learners):  # every learner starts on θ version 0 now: its first round's clock
            state.answered(rank, now)
        loops = [("quorum-sync", self._serve)] + ([("quorum-recv", self._receive)] if learners > 1 else [])
        super().__init__("the quorum synchronizer", loops)  # the threads start: the state is ready

    # -- the threads --------------------------------------------------------------------------

    def _receive(self) -> None:
        """Remote learners' deliveries, from any source, until every one of them has left."""
        remaining = self.learners - 1
        while remaining:
            head = torch.empty(HEADER, dtype=torch.int64, device=HOST)
            work = dist.irecv(head, group=self.deliveries, tag=_TAG_HEAD)  # from any sender
            assert work is not None  # this rank is in the group
            work.wait()
            rank = int(work._source_rank())
            kind, base, steps, tokens, compute_us = (int(v) for v in head.tolist())
            if kind == LEAVE:
                self.events.put(Leave(rank))
                remaining -= 1
                continue
            body = torch.empty(self.numel, dtype=self.dtype, device=HOST)
            dist.recv(body, group=self.deliveries, group_src=rank, tag=_TAG_BODY)
            self.events.put(Contribution(rank, base, steps, tokens, compute_us / 1e6, body))

    def _serve(self) -> None:
        state = self.state
        while True:
            with self.lock:
                if state.done and self.events.empty():
                    state.close()
                    return
                deadline = state.deadline()
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                event = self.events.get(timeout=timeout)
            except queue.Empty:
                event = None
            with self.lock:
                now = time.monotonic()
                answer: list[int] = []
                if isinstance(event, Leave):
                    state.leave(event.rank, now)
                elif isinstance(event, Stop):
                    answer = state.stop()
                elif event is not None:
                    event.delta = event.delta.to(state.theta[0].device)
                    answer = state.deliver(event, now)
                if state.due(now):
                    answer += state.merge(now)
                self._answer(answer)

    def _answer(self, ranks: list[int]) -> None:
        """Send the latest θ to `ranks` (under the lock)."""
        if not ranks:
            return
        theta = self.state.flat_theta()
        version = self.state.version
        host = theta.cpu() if any(r != 0 for r in ranks) else theta
        for rank in ranks:
            self.state.answered(rank, time.monotonic())
            if rank == 0:
                self.mine.put((version, theta.clone()))
                continue
            dist.send(torch.tensor([version, int(self.state.stopping)], dtype=torch.int64, device=HOST),
                      group=self.replies, group_dst=rank, tag=_TAG_REPLY)
            dist.send(host, group=self.replies, group_dst=rank, tag=_TAG_THETA)

    # -- checkpoints --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return self.state.state_dict()

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        with self.lock:
            self.state.load_state_dict(saved)
            now = time.monotonic()
            for rank in range(self.learners):  # the resumed learners' rounds start now
                self.state.sent_at[rank] = now


def send_delivery(group: Any, base: int, steps: int, tokens: int, compute_s: float, delta: Tensor) -> None:
    """A remote learner's delivery to rank 0 (its training thread)."""
    dist.send(header(DELIVER, base, steps, tokens, compute_s), group=group, group_dst=0, tag=_TAG_HEAD)
    dist.send(delta.cpu(), group=group, group_dst=0, tag=_TAG_BODY)


def send_leave(group: Any) -> None:
    dist.send(header(LEAVE, 0, 0, 0, 0.0), group=group, group_dst=0, tag=_TAG_HEAD)


def receive_theta(group: Any, numel: int, dtype: torch.dtype) -> tuple[int, bool, Tensor]:
    """A remote learner's reply from rank 0: (θ's version, whether to stop, θ flat on the host)."""
    head = torch.empty(2, dtype=torch.int64, device=HOST)
    dist.recv(head, group=group, group_src=0, tag=_TAG_REPLY)
    theta = torch.empty(numel, dtype=dtype, device=HOST)
    dist.recv(theta, group=group, group_src=0, tag=_TAG_THETA)
    version, stop = (int(v) for v in head.tolist())
    return version, bool(stop), theta
