"""What a worker shares in the modes that train H local steps and then deliver the round to a server
without a collective (sync=quorum_diloco's learners, sync=halos's workers): the inner optimizer, the
round's counting (steps, compute seconds, the dense bytes a per-step exchange would have sent), the
delivery at the round's end, the stop rank 0 sends with an answer, and leaving at the end."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from compbench.optim.optimizers import optimizer_over
from compbench.records.stats import StepStats


class RoundLearner:
    """The shared part of a worker (see the module); a mode adds `deliver` (send the round, take the
    answer's θ, set `stopped` from it) and `leave` (tell its server it left)."""

    name: ClassVar[str]
    stats: StepStats
    inner_steps: int
    numel: int

    def start_rounds(self) -> None:
        self.inner = 0  # steps taken in the current round
        self.rounds = 0  # rounds delivered
        self.taken = 0  # steps taken in all
        self.version = 0  # the version of the θ this worker trains from
        self.compute_s = 0.0  # compute seconds of the current round
        self.in_step = False
        self.closed = False
        self.stopped = False  # rank 0's stop came with the last answer: the trainer ends here

    def deliver(self) -> None:
        raise NotImplementedError

    def leave(self) -> None:
        raise NotImplementedError

    def make_optimizer(self, model: nn.Module, optim: dict[str, Any]) -> torch.optim.Optimizer:
        trainable = [p for p in model.parameters() if p.requires_grad]  # setup's `params`, in its order
        self.inner_optimizer = optimizer_over(model, trainable, optim)
        return self.inner_optimizer

    def begin_step(self, step: int, epoch: float) -> None:
        self.in_step = True

    def before_backward(self) -> None:
        pass

    def synchronize(self) -> None:
        pass  # local steps: each worker steps on its own gradients

    def after_step(self) -> None:
        assert not self.closed, f"sync={self.name} trained a step after its worker left"
        self.in_step = False
        ms = self.stats.ms  # this step's phases so far: compute and optimizer are over
        self.compute_s += (ms["compute"] + ms["optimizer"]) / 1e3
        self.inner += 1
        self.taken += 1
        self.stats.bytes_dense += 4 * self.numel  # what a per-step exchange would have sent
        if self.inner == self.inner_steps:
            self.deliver()
            self.inner = 0
            self.rounds += 1

    def stop_requested(self) -> bool:
        """compbench.sync.IndependentLearners: rank 0's stop came with this worker's last answer."""
        return self.stopped

    def drain(self) -> None:
        """Inside a step (a dropped one): nothing is in flight. Outside (the end of training): leave."""
        if self.in_step:
            self.in_step = False
            return
        if self.closed:
            return
        self.closed = True
        self.leave()
