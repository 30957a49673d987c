"""`sync=delayed_diloco`: DiLoCo with its outer step applied `staleness` (k) rounds late, so that a
round's outer-gradient exchange travels behind the next k rounds of inner steps instead of stalling
every worker at the round's end. The update is PCCL's asynchronous DiLoCo (PrimeIntellect-ai/pccl,
docs "Async DiLoCo" and `python/examples/nanogpt_diloco/async_diloco.py`, there with k = 1; torchft's
`AsyncDiLoCo` applies the same rule), generalized to k rounds; k = 0 is sync=diloco exactly.

θ is the global parameters, the same on every worker; θ_m worker m's local parameters; OuterOpt the
outer Nesterov SGD of sync=diloco (`outer_lr`, `outer_momentum`, `nesterov`, with sync=diloco's
defaults, so that the staleness is the only difference; PCCL's example steps plain SGD, lr 0.7 without
momentum: `outer_momentum=0 nesterov=false`); H = `inner_steps`;
rounds r = 0, 1, ... At the end of round r (after its H inner steps, on every worker m):

    Δ_r,m = θ − θ_m                    θ as it was when round r started (θ only moves at round ends)
    submit Δ_r,m                       memory -> compressor -> communicator; its average is Δ̄_r
    if r ≥ k:  θ ← OuterOpt(θ, Δ̄_(r−k))  waits for round r−k's exchange, and only for that one
    θ_m ← θ                            on every worker, whether θ moved or not

Each round's outer gradient is measured from the θ that round started from, and is applied k outer
steps after that θ: to θ_(r) = θ_(r−k) moved by the averages of rounds r−2k .. r−k−1 (what PCCL's
example calls applying "slightly outdated" pseudo-gradients). The first k rounds all start from the
initial θ (PCCL's bootstrap: the local parameters are reset to the unmoved θ). Local progress does
not carry over when θ moves: θ_m is replaced by θ. Nothing is lost by it: round r's progress is
Δ_r, in flight, and reaches θ k rounds later; keeping θ_m's progress as well would count it twice.

Where the rule differs from the other overlapped updates:
- sync=diloco with `eager=true` (Kale et al. 2025) steps θ at the round's end at once on the eager
  outer gradient Δ_r,m/N + (Δ̄_(r−1) − Δ_(r−1),m/N), this worker's fresh part and the others' from
  the last round: each worker's θ is its own. Here every worker steps on the full average of round
  r−k alone, so θ stays the same on every worker, and k is a setting (eager overlaps one round).
- Streaming DiLoCo's `overlap` τ (sync=diloco, and forgather's streaming worker, which applies a
  fragment's result when it arrives) merges the new θ into the local parameters τ steps after Δ
  was taken: the progress of those τ steps is replaced (mix=0) or mixed. Here the replacement
  happens when Δ is taken, so no step's progress is dropped.
- forgather's asynchronous mode (a parameter server applying each worker's outer gradient when it
  arrives, with Delayed Nesterov momentum) and ACCO (Nabli et al. 2024: the per-step gradient
  exchange and sharded optimizer step overlapped with the next step's gradient accumulation, its
  one-step delay compensated) are other methods, not implemented here.

Exchanges in flight: up to k at once (each round's submission stays in flight until the round it is
applied at), waited for one at a time in submission order (`GradientPipeline.collect(groups)`),
so the wait at a round's end is only what is left of the exchange of round r−k. The end of a run
leaves the last k rounds' averages unapplied, as PCCL's loop does when it stops: the final θ has
the outer steps of rounds 0 .. R−k−1 of R. A checkpoint (`state_dict`) waits for every exchange in
flight and saves their averages, each applied at its round after a resume: the resume is exact.

Bytes, rounds, the recipe (inner steps clipped to norm 1), the compositions (a compressor, memory
and communicator on the outer gradient) and the replica diagnostics are sync=diloco's: its round end
books the exchange's bytes, every step 4n dense bytes.

Refused at compose time: a staleness that is not an integer >= 0 (`check_options`); engine=horovod
(it matches collectives in flight by name, and from k = 2 two rounds' exchanges of the same tensors
would be in flight under one name; `SyncTraits.engines`); engine.elastic=true (every round ends with
exchanges in flight that span the old workers, and PCCL's insertion of a joiner into them is not
implemented: `SyncTraits.elastic`); sharding (the mode is run on whole tensors only); and a run of
no more than k rounds, where no outer step would ever be applied (`SyncTraits.delay_key`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from compbench.base.values import is_int
from compbench.engines.base import Engine
from compbench.records.stats import StepStats
from compbench.schedulers import Scheduler
from compbench.seam.pipeline import GradientPipeline
from compbench.sync import ExchangePlan, SyncTraits
from compbench.sync.diloco import RECIPE, DiLoCo
from compbench.sync.diloco import check_options as check_diloco


def check_options(inner_steps: int = 50, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                  nesterov: bool = True, staleness: int = 1) -> None:
    """Config-time check of sync=delayed_diloco's settings."""
    check_diloco(inner_steps, outer_lr, outer_momentum, nesterov)
    if not is_int(staleness) or staleness < 0:
        raise ValueError(f"sync.staleness={staleness} must be an integer >= 0 (rounds each outer step is "
                         "applied late); pass sync.staleness=1 (PCCL's) or sync.staleness=0 (DiLoCo)")


@dataclass
class Exchange:
    """One round's outer-gradient exchange not applied yet: the pipeline groups it is in flight as, or
    its average once waited for (by `drain`, or loaded from a checkpoint)."""

    groups: int
    averaged: list[Tensor] | None = None


class DelayedDiLoCo(DiLoCo):
    """DiLoCo whose outer step applies the average of k rounds before (see the module)."""

    name = "delayed_diloco"
    sync_traits: ClassVar[SyncTraits] = SyncTraits(per_step=False, period_key="inner_steps", recipe=RECIPE,
                                                   replicas_diverge=True, engines=("torch",), elastic=False,
                                                   delay_key="staleness")
    check_options: ClassVar[Callable[..., None]] = staticmethod(check_options)

    def __init__(self, pipeline: GradientPipeline, scheduler: Scheduler, engine: Engine, stats: StepStats,
                 inner_steps: int = 50, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 nesterov: bool = True, staleness: int = 1) -> None:
        check_options(inner_steps, outer_lr, outer_momentum, nesterov, staleness)
        super().__init__(pipeline, scheduler, engine, stats, inner_steps, outer_lr, outer_momentum, nesterov)
        self.staleness = int(staleness)
        self.in_flight: deque[Exchange] = deque()  # oldest first

    def after_step(self) -> None:
        self.inner += 1
        dense = 4 * self.numel  # what a per-step exchange would have sent: the effective ratio compares
        if self.inner == self.inner_steps:
            dense -= self.end_round()  # the pipeline books what it submits
            self.inner = 0
            self.rounds += 1
        self.stats.bytes_dense += dense

    @torch.no_grad()
    def end_round(self) -> int:
        """Submit this round's Δ = θ − θ_local, apply round r−k's average to θ (from round k on),
        and restart the local parameters from θ; returns the dense bytes submitted."""
        members = self.members[0]  # one fragment: every trainable tensor
        deltas = [self.outer_params[i] - self.params[i][1] for i in members]
        before = self.pipeline.in_flight
        sent = self.submit(0, deltas)
        self.in_flight.append(Exchange(self.pipeline.in_flight - before))
        if len(self.in_flight) > self.staleness:
            averaged = self.averaged_of(self.in_flight.popleft())
            with self.stats.time("optimizer"):
                self.step_fragment(members, averaged)  # θ steps; every local tensor copies it
        else:  # the first k rounds: θ has not moved, and the next round starts from it again
            for i in members:
                self.params[i][1].copy_(self.outer_params[i])
        return sent

    def averaged_of(self, exchange: Exchange) -> list[Tensor]:
        """The exchange's averaged Δs in the model's order, waiting for its groups (the oldest in the
        pipeline: exchanges are waited for in the order they were submitted)."""
        if exchange.averaged is not None:
            return exchange.averaged
        averaged = dict(self.pipeline.collect(exchange.groups))
        return [averaged[f"outer.{self.params[i][0]}"] for i in self.members[0]]

    def drain(self) -> None:
        """Wait for every exchange in flight; each average is kept for the round it is applied at."""
        for exchange in self.in_flight:
            if exchange.averaged is None:
                exchange.averaged = self.averaged_of(exchange)

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "inner_steps": self.inner_steps, "outer_lr": self.outer_lr,
                "outer_momentum": self.outer_momentum, "nesterov": self.nesterov, "rounds": self.rounds,
                "staleness": self.staleness}

    def exchange_plan(self) -> ExchangePlan:
        """One exchange every H steps, hidden behind the next k rounds' H·k steps."""
        return ExchangePlan(every=self.inner_steps, pattern=self.pipeline.comm.traits.pattern,
                            hidden_steps=self.staleness * self.inner_steps)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()  # sync=diloco's, after `drain`: every average is in hand
        state["delayed"] = [[t.clone() for t in exchange.averaged or []] for exchange in self.in_flight]
        return state

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.in_flight = deque(Exchange(0, [t.clone() for t in averaged]) for averaged in state["delayed"])

