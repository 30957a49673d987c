"""`sync=step`: every step's gradients through a scheduler and compbench's pipeline (memory ->
compressor -> communicator), the averages written into `p.grad` before the optimizer steps. Where
the optimizer steps from a sparse .grad in one pass (`sparse_params` of optim.optimizers's SGD, Adam and
AdamW), a sparsifier's average is handed over as the decoded sparse payload
(`GradientPipeline.sparse_names`)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from compbench.optim.optimizers import ONE_PASS, build_optimizer, param_groups
from compbench.schedulers import Scheduler
from compbench.seam.pipeline import GradientPipeline
from compbench.sync import ExchangePlan, SyncTraits, fits_any_model


class StepSync:
    """Per-step synchronization: the seed papers' setting (and `wrap_compress_optimizer`'s)."""

    name = "step"
    sync_traits: ClassVar[SyncTraits] = SyncTraits(shards=True)

    @staticmethod
    def check_options() -> None:
        """Config-time check of the mode's own settings: it has none."""

    check_model = staticmethod(fits_any_model)

    def __init__(self, pipeline: GradientPipeline, scheduler: Scheduler, **_: Any) -> None:
        self.pipeline, self.scheduler = pipeline, scheduler

    def setup(self, model: nn.Module) -> nn.Module:
        self.scheduler.setup(model)
        return model

    def make_optimizer(self, model: nn.Module, optim: dict[str, Any]) -> torch.optim.Optimizer:
        selection = self.pipeline.selection
        groups = param_groups(model, self.pipeline.memory.traits.owns_momentum,
                              lambda p: selection.compresses(p, selection.dense_steps), optim)
        optimizer = build_optimizer(groups, **optim)
        if isinstance(optimizer, ONE_PASS) and not self.scheduler.traits.partitions:
            # Decode and step in one pass: these tensors' sparse averages go to the optimizer as they are.
            takes = optimizer.sparse_params()
            self.pipeline.sparse_names = frozenset(n for n, p in model.named_parameters() if p in takes)
        return optimizer

    def begin_step(self, step: int, epoch: float) -> None:
        self.pipeline.begin_step(step, epoch)

    def before_backward(self) -> None:
        self.scheduler.before_backward(self.pipeline)  # overlapping schedulers arm their hooks

    def synchronize(self) -> None:
        self.scheduler.synchronize(self.pipeline)  # memory -> compress -> communicate -> decompress

    def after_step(self) -> None:
        pass

    def drain(self) -> None:
        self.pipeline.collect()  # groups an overlapping scheduler already submitted

    def summary(self) -> dict[str, Any]:
        return self.scheduler.summary()

    def exchange_plan(self) -> ExchangePlan:
        return ExchangePlan(pattern=self.pipeline.comm.traits.pattern,
                            overlaps_backward=self.scheduler.overlapping,
                            warmup_steps=self.pipeline.selection.dense_steps)

    def state_dict(self) -> dict[str, Any]:
        """Per rank; the scheduler's decisions are the same on every rank and the checkpoint keeps
        them apart (rank 0's)."""
        return pipeline_state(self.pipeline)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_pipeline_state(self.pipeline, state)


def pipeline_state(pipeline: GradientPipeline, **extra: Any) -> dict[str, Any]:
    """The pipeline's per-rank state: error-feedback memory, compressor and communicator."""
    return {"memory": pipeline.memory.state_dict(), "compressor": pipeline.compressor.state_dict(),
            "comm": pipeline.comm.state_dict(), **extra}


# The parts of a rank's state that are its own residuals and codes (`pipeline_state`): a worker that
# joins an elastic run starts them empty, whatever the peer it copies holds.
OWN_PIPELINE_KEYS = ("memory", "compressor", "comm")


def joiner_state(peer: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any]:
    """The per-rank state a worker joining an elastic run starts from: a peer's (its round position,
    local parameters, outer optimizer: what must agree), with its own `fresh` error-feedback memory,
    compressor and communicator state (a peer's residual is that peer's: copying it would count it
    twice) and its own random state."""
    return {**peer, **{k: fresh[k] for k in (*OWN_PIPELINE_KEYS, "torch_rng", "cuda_rng") if k in fresh}}


def load_pipeline_state(pipeline: GradientPipeline, state: dict[str, Any]) -> None:
    pipeline.memory.load_state_dict(state["memory"])
    pipeline.compressor.load_state_dict(state["compressor"])
    pipeline.comm.load_state_dict(state["comm"])
