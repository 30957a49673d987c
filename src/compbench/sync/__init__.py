"""Synchronization modes: the one seam for every way of keeping workers in agreement.

The trainer loop asks its synchronizer, once per step, around the optimizer's step:

    sync.before_backward(); loss.backward(); sync.synchronize(); optimizer.step(); sync.after_step()

Whether a step talks, and what it sends, is the synchronizer's:
- `step` (per step): a scheduler runs each step's gradients through memory -> compressor ->
  communicator (compbench's pipeline) and writes the averages into `p.grad` in `synchronize`.
- `ddp`, `horovod_optimizer` (the baselines: torch DDP with its comm hooks, Horovod's
  DistributedOptimizer) synchronize gradients their own way, through none of compbench's pipeline.
- `diloco` (periodic): workers step their own optimizer H times without talking; in `after_step`
  every H steps the outer gradient goes through the same pipeline and an outer optimizer moves the
  global parameters (SparseLoCo and quantized Streaming DiLoCo are compositions of it).
- `delayed_diloco` (periodic): diloco with each outer step applied `staleness` rounds late, so that
  a round's exchange travels behind the next rounds' inner steps (PCCL's asynchronous DiLoCo).
- `desloc` (periodic): DES-LOC, Adam's parameters and its two moments averaged through the same
  pipeline, each on its own period.
- `demo`, `onebit_adam`, `onebit_lamb` (optimizer level): per-step modes whose optimizer is DeMo's,
  1-bit Adam's or 1-bit LAMB's update rule; what they exchange (DeMo's momentum is the error-feedback
  memory, 1-bit Adam's and 1-bit LAMB's the momentum the optimizer mixes into `p.grad`) goes through
  the same pipeline, with their recipes' compressor (chunk_dct, rms_sign), memory and communicator
  unless the user picks others.

Every synchronizer saves and loads its per-rank state (memories, compressor and communicator
state, outer optimizer, local parameters where ranks diverge) through `state_dict`, so that a
resume mid-round is exact. What a mode accepts is its `sync_traits`, read by compbench.compose.compat.
Adding a mode = its file here + `conf/sync/NAME.yaml`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import nn

if TYPE_CHECKING:
    from compbench.schedulers import Scheduler
    from compbench.seam.pipeline import GradientPipeline


@dataclass(frozen=True)
class SyncTraits:
    """What a synchronization mode does, declared once per class; compbench.compose.compat reads only this.

    pipeline: what it exchanges goes through compbench's memory -> compressor -> communicator
      (configured by the compressor/memory/comm groups); without it those must stay at their defaults.
    per_step: exchanges gradients every step through a scheduler (with `pipeline`: the scheduler
      group applies; otherwise scheduler must stay layerwise).
    period_key: the setting that names the number of steps per round (a round's steps all count
      in the per-step figures: a step that sends nothing books 0 bytes); None: every step.
    period_keys: further periods of a mode that exchanges several things each on its own period
      (DES-LOC's); each is checked against max_steps as period_key is, and a round is the least
      common multiple of them all.
    optimizers: the `optim=` options it works with (None: any).
    optimizer_keys: for a mode that builds its own optimizer, the optim settings it takes; every
      other optim setting must keep its default (nothing is silently ignored).
    engines: the engines it runs on.
    pattern: for a mode without `pipeline`, the collectives of one exchange for the what-if model
      ("allreduce"); with it, the communicator's `traits.pattern` applies.
    recipe: the settings the mode runs with unless the user sets the key (group choices such as
      "compressor": "chunk_dct", and keys such as "memory.beta"), applied before the compressor's own.
    replicas_diverge: the workers' parameters differ between exchanges (local steps, partial
      averaging): each evaluation then also evaluates the workers' averaged parameters and records
      the distance between the replicas (compbench.train.replicas).
    elastic: the mode runs under engine.elastic=true (compbench.train.elastic): its state can be
      committed at a round's end and taken up by a world of another size. False for the baselines,
      whose engine-side state (DDP's reducer, Horovod's optimizer hooks) is fixed when they start.
    shards: the mode runs across the shard groups of a sharded run (compbench.sync.sharded): on
      each worker's local shards, as if they were whole tensors (its exchanges and updates treat
      every element alike, or per tensor where a shard is as good a unit as the tensor).
    delay_key: the setting that applies each outer step that many rounds (of `period_key`) late
      (sync=delayed_diloco's staleness): a run of no more rounds than it would apply none.
    at_most_workers: settings that count workers (sync=quorum_diloco's `quorum`): each, where set
      (not null), must be at most engine.np (checked at compose time).
    divides_workers: settings that split the workers into equal groups (sync=halos's `regions`):
      each must divide engine.np (checked at compose time).
    checkpoints: the mode's state can be saved and resumed; False (sync=halos, whose servers' state
      lives in threads with messages in flight) refuses checkpoint=true, checkpoint_every_steps and
      resume at compose time.
    per_worker_key: the setting that gives each worker its own number of trained steps per round
      (sync=diloco's `inner_steps_per_worker`; null: every worker trains every step). A mode that
      declares it answers `step_share()` (PerWorkerSteps), which the trainer asks every step; where
      the setting is set, compbench.sync.per_worker_steps checks the job at compose time.
    """

    pipeline: bool = True
    per_step: bool = True
    period_key: str | None = None
    period_keys: tuple[str, ...] = ()
    optimizers: tuple[str, ...] | None = None
    optimizer_keys: tuple[str, ...] | None = None
    engines: tuple[str, ...] = ("horovod", "torch")
    pattern: str | None = None
    recipe: Mapping[str, Any] = field(default_factory=dict)  # read-only by convention
    replicas_diverge: bool = False
    elastic: bool = True
    shards: bool = False
    delay_key: str | None = None
    at_most_workers: tuple[str, ...] = ()
    learners_independent: bool = False
    divides_workers: tuple[str, ...] = ()
    checkpoints: bool = True
    per_worker_key: str | None = None


@dataclass(frozen=True)
class ExchangePlan:
    """How a mode's exchanges fall in time, for the what-if model (compbench.race.model) and
    results.json's `exchange`: one exchange every `every` steps, in the collectives of `pattern`
    (compbench.comm.cost_model), hidden behind `hidden_steps` steps of compute that run while
    it travels (diloco's overlap, its eager update) or behind back-propagation
    (`overlaps_backward`: a per-step exchange started from backward hooks); the first
    `warmup_steps` steps exchange the gradients dense instead (1-bit Adam's warm-up, a compressor's
    `dense_steps`); `group`: the workers of one allreduce where it runs inside groups
    (pattern "group_allreduce", NoLoCo's pairs), 0 for the whole world."""

    every: int = 1
    pattern: str = "allreduce"
    hidden_steps: int = 0
    overlaps_backward: bool = False
    warmup_steps: int = 0
    # pattern="group_allreduce": the allreduce runs inside groups of `group` workers, not the world
    group: int = 0


def fits_any_model(model: nn.Module, **options: Any) -> None:
    """`Synchronizer.check_model` of a mode whose settings fit every model."""


@runtime_checkable
class Synchronizer(Protocol):
    sync_traits: ClassVar[SyncTraits]
    # The pipeline it sends through and the scheduler that feeds it; None where the mode has none
    # (the baselines; diloco sends without a scheduler).
    pipeline: GradientPipeline | None
    scheduler: Scheduler | None

    @staticmethod
    def check_model(model: nn.Module, **options: Any) -> None:
        """Config-time check of the mode's `options` (its config keys) against the model, built on
        the meta device in the parent: a ValueError of one line naming the fix."""
        ...

    def setup(self, model: nn.Module) -> nn.Module:
        """Once, before training; returns the module the trainer trains (a baseline wraps it)."""
        ...

    def make_optimizer(self, model: nn.Module, optim: dict[str, Any]) -> torch.optim.Optimizer:
        """The run's optimizer from the `optim` group's settings (after `setup`)."""
        ...

    def begin_step(self, step: int, epoch: float) -> None: ...
    def before_backward(self) -> None: ...
    def synchronize(self) -> None:
        """After back-propagation, before the optimizer's step: averaged gradients into `p.grad`
        (or nothing, for modes that do not exchange gradients)."""
        ...

    def after_step(self) -> None:
        """After the optimizer's step (a periodic mode ends its round here)."""
        ...

    def drain(self) -> None:
        """Finish what was already started: when a step is dropped (non-finite gradients) and at the
        end of training (an exchange in flight must end before the engine does)."""
        ...

    def summary(self) -> dict[str, Any]: ...
    def exchange_plan(self) -> ExchangePlan: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class IndependentLearners(Protocol):
    """What the trainer asks of a mode whose `sync_traits.learners_independent` is true (and only of
    such a mode): the stop travels through the mode's own messages, not a collective."""

    def stop_requested(self) -> bool:
        """Whether this worker was told to stop training (read by the trainer once per step)."""
        ...

    def stop_learners(self) -> None:
        """Rank 0's training ended (target, budget or max_steps): tell the other workers to stop at
        their next exchange. Called by rank 0 only, once, before the collectives after training."""
        ...


@dataclass(frozen=True)
class StepShare:
    """Who trains one step of the loop: this worker (`mine`; otherwise it idles: no forward,
    backward or optimizer step, its batch unseen) and how many workers do (`workers`: the step's
    global units are a batch's units times it)."""

    mine: bool
    workers: int


class PerWorkerSteps(Protocol):
    """What the trainer asks of a mode that declares `sync_traits.per_worker_key` (and only of such a
    mode), every step after `begin_step`."""

    def step_share(self) -> StepShare:
        """Who trains the coming step."""
        ...
