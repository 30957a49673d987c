"""`sync=diloco`: DiLoCo's rounds (Douillard et al., 2023; reference PrimeIntellect-ai/diloco_simple
`pure_torch_diloco.py`, meta-pytorch/torchft `torchft/local_sgd.py`).

Every worker starts a round from the global parameters θ and runs `inner_steps` (H) steps of the
run's optimizer (`optim=`, e.g. AdamW; its state persists across rounds) without talking. Then the
outer gradient Δ = θ − θ_local goes, tensor by tensor, through compbench's pipeline (memory ->
compressor -> communicator: the `compressor`, `memory` and `comm` groups), its average becomes θ's
gradient, the outer optimizer (SGD, Nesterov momentum; `outer_lr`, `outer_momentum`) steps θ, and
every worker continues from the new θ. Bytes per step = a round's bytes / H: the steps inside a
round book 0 bytes sent (and the 4n dense bytes a per-step exchange would send, so the effective
ratio compares with DDP) and every step counts in the run's per-step figures.

Compositions, not new code paths:
- DiLoCo: compressor=none comm=allreduce (the dense allreduce of the reference).
- Streaming DiLoCo's quantized outer gradients: compressor=fp16 or compressor=qsgd.
- SparseLoCo: compressor=sparseloco comm=allgather memory=residual memory.beta=0.95
  memory.gamma=<outer lr>, outer_momentum=0 (the error accumulator replaces momentum).

The outer gradient is scaled by `outer_lr` in the outer step only; memory=residual's `gamma` scales
what enters the error accumulator (SparseLoCo's e = βe + αΔ, with outer_lr then 1).
The selection rules apply per tensor, with the round's index counting as the step for
`dense_steps` (rounds sent dense).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from compbench.engines.base import Engine
from compbench.schedulers import Scheduler
from compbench.stats import StepStats
from compbench.sync import SyncTraits
from compbench.sync.step import load_pipeline_state, pipeline_state
from compbench.train.optim import build_optimizer
from compbench.train.pipeline import GradientPipeline


def check_options(inner_steps: int = 50, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                  nesterov: bool = True) -> None:
    """Config-time check of sync=diloco's settings."""
    if isinstance(inner_steps, bool) or not isinstance(inner_steps, int) or inner_steps < 1:
        raise ValueError(f"sync.inner_steps={inner_steps} must be an integer >= 1 (steps per round)")
    for key, value, low in (("outer_lr", outer_lr, 0.0), ("outer_momentum", outer_momentum, 0.0)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= low:
            raise ValueError(f"sync.{key}={value} must be a number >= {low:g}")
    if float(outer_lr) == 0.0:
        raise ValueError("sync.outer_lr=0 would never move the global parameters; "
                         "pass e.g. sync.outer_lr=0.7")
    if float(outer_momentum) >= 1.0:
        raise ValueError(f"sync.outer_momentum={outer_momentum} must be < 1")
    if nesterov and float(outer_momentum) == 0.0:
        raise ValueError("sync.nesterov=true needs sync.outer_momentum > 0; pass sync.nesterov=false")


class DiLoCo:
    """Local steps, then an outer step on the averaged outer gradient (see the module)."""

    name = "diloco"
    sync_traits: ClassVar[SyncTraits] = SyncTraits(per_step=False, period_key="inner_steps")
    check_options = staticmethod(check_options)
    scheduler = None  # the outer gradient goes tensor by tensor, once per round

    def __init__(self, pipeline: GradientPipeline, scheduler: Scheduler, engine: Engine, stats: StepStats,
                 inner_steps: int = 50, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 nesterov: bool = True) -> None:
        check_options(inner_steps, outer_lr, outer_momentum, nesterov)
        self.pipeline, self.engine, self.stats = pipeline, engine, stats
        self.inner_steps, self.outer_lr = int(inner_steps), float(outer_lr)
        self.outer_momentum, self.nesterov = float(outer_momentum), bool(nesterov)
        self.inner = 0  # steps taken in the current round
        self.rounds = 0

    def setup(self, model: nn.Module) -> nn.Module:
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        # θ, the global parameters: every rank holds the same copy (the trainer broadcast rank 0's).
        self.outer_params = [p.detach().clone() for _, p in self.params]
        self.outer = torch.optim.SGD(self.outer_params, lr=self.outer_lr, momentum=self.outer_momentum,
                                     nesterov=self.nesterov)
        return model

    def make_optimizer(self, model: nn.Module, optim: dict[str, Any]) -> torch.optim.Optimizer:
        self.inner_optimizer = build_optimizer([{"params": [p for _, p in self.params]}], **optim)
        return self.inner_optimizer

    def begin_step(self, step: int, epoch: float) -> None:
        # The compressor's step counter and the selection's warm-up count rounds: they see one
        # exchange per round.
        self.pipeline.begin_step(self.rounds, epoch)

    def before_backward(self) -> None:
        pass

    def synchronize(self) -> None:
        pass  # inner steps: each worker steps on its own gradients

    def after_step(self) -> None:
        self.inner += 1
        if self.inner == self.inner_steps:
            self.outer_step()  # the pipeline books the dense bytes of what it sends
            self.inner = 0
            self.rounds += 1
        else:  # what a per-step exchange would have sent: the effective ratio compares with it
            self.stats.bytes_dense += 4 * sum(p.numel() for _, p in self.params)

    @torch.no_grad()
    def outer_step(self) -> None:
        for (name, p), theta in zip(self.params, self.outer_params, strict=True):
            self.pipeline.submit(f"outer.{name}", theta - p)  # Δ = θ − θ_local, handed over
        averaged = self.pipeline.collect()
        with self.stats.time("optimizer"):
            for (_, delta), theta in zip(averaged, self.outer_params, strict=True):
                theta.grad = delta.reshape(theta.shape)
            self.outer.step()
            for (_, p), theta in zip(self.params, self.outer_params, strict=True):
                p.copy_(theta)
                theta.grad = None

    def drain(self) -> None:
        pass  # nothing is started before the optimizer's step

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "inner_steps": self.inner_steps, "outer_lr": self.outer_lr,
                "outer_momentum": self.outer_momentum, "nesterov": self.nesterov, "rounds": self.rounds}

    def state_dict(self) -> dict[str, Any]:
        # Ranks diverge inside a round: each keeps its own parameters and inner optimizer state.
        return pipeline_state(
            self.pipeline, inner=self.inner, rounds=self.rounds,
            outer_params=[t.clone() for t in self.outer_params], outer=self.outer.state_dict(),
            local_params=[p.detach().clone() for _, p in self.params],
            inner_optimizer=self.inner_optimizer.state_dict())

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_pipeline_state(self.pipeline, state)
        self.inner, self.rounds = int(state["inner"]), int(state["rounds"])
        for theta, saved in zip(self.outer_params, state["outer_params"], strict=True):
            theta.copy_(saved)
        self.outer.load_state_dict(state["outer"])
        for (_, p), saved in zip(self.params, state["local_params"], strict=True):
            p.copy_(saved)
        self.inner_optimizer.load_state_dict(state["inner_optimizer"])
