"""`sync=noloco`: NoLoCo's rounds (Kolehmainen et al. 2025, "NoLoCo: No-all-reduce Low Communication
Training Method for Large Models", arXiv 2506.10911; reference jkolehm/noloco
`src/noloco/sparse_optimizer_c.py`, its `outer_step` and `SparseOptimizerC`, with the outer settings of
its `configs/no_reduce_exp` NoLoCo runs: outer_lr 0.7, outer_momentum 0.3).

DiLoCo's rounds without a global all-reduce. Every worker keeps its own outer parameters φ_i and
momentum m_i and runs `inner_steps` (H) steps of the run's optimizer (`optim=`) from them without
talking. At the end of a round the workers split into random groups of `group_size` (2: pairs) and
each averages with its group only:

    m_i ← μ·m_i + lr·mean_g(θ_j − φ_j) + lr·(mean_g(φ_j) − φ_i)
    φ_i ← φ_i + m_i;   θ_i ← φ_i

(mean_g: over the worker's group; μ = `outer_momentum`, lr = `outer_lr`: the reference's outer step,
momentum in heavy-ball form, one rate for the outer gradient and for the pull towards the group).
The groups: a permutation of the ranks by numpy's `default_rng(s + 1)`, s the steps taken, dealt
round-robin into size/group_size groups (the reference's `create_random_permutation` and `batched`),
so every rank draws the same groups without talking.

Deviations from the reference, each documented:
- One tensor travels instead of two: mean_g(θ_j − φ_j) + mean_g(φ_j) = mean_g(θ_j), so each worker
  averages its local parameters θ within its group, in one collective of the model's size
  (`Engine.allreduce_group`: a torch.distributed process group, a Horovod process set), and takes
  m_i ← μ·m_i + lr·(mean_g(θ_j) − φ_i). Equal to the reference up to rounding, half its bytes.
- The reference sends through the group's first rank with point-to-point messages; here the group's
  allreduce does it (the same average).
- The run's optimizer for the inner steps: by the recipe AdamW (the reference uses Adam; a user's
  `optim=` wins), the inner steps clipped as DiLoCo's recipe clips them. H = 100 (`inner_steps`),
  the reference configs' value.

With 2 workers the one group is both workers: the average is global and NoLoCo differs from DiLoCo
only by its outer update (per-worker φ, heavy-ball momentum, no separate outer gradient). NoLoCo's
difference shows from 4 workers (`compbench cluster`, or engine.np=4 for a local smoke test).

What it sends goes through no compressor: the exchange is the group's dense allreduce (compbench's
pipeline and its communicators exchange among all workers), so compressor, memory and comm stay at
their defaults (refused otherwise). Bytes: the round-end step books the model's fp32 bytes as a
dense allreduce; every step books the 4n dense bytes a per-step exchange would send.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from compbench.base.values import is_int
from compbench.engines.base import Engine
from compbench.optim.optimizers import optimizer_over
from compbench.records.stats import StepStats
from compbench.sync import ExchangePlan, SyncTraits, fits_any_model
from compbench.sync.diloco import check_options as check_diloco

# The reference's inner optimizer (Adam; AdamW here, the transformer recipes' choice) and DiLoCo's
# clipping of every inner gradient.
RECIPE = {"optim": "adamw", "optim.clip_grad_norm": 1.0}


def check_options(inner_steps: int = 100, outer_lr: float = 0.7, outer_momentum: float = 0.3,
                  group_size: int = 2) -> None:
    """Config-time check of sync=noloco's settings."""
    check_diloco(inner_steps=inner_steps, outer_lr=outer_lr, outer_momentum=outer_momentum)
    if not is_int(group_size) or group_size < 2:
        raise ValueError(f"sync.group_size={group_size} must be an integer >= 2 (workers averaging together "
                         "each round); pass sync.group_size=2 (pairs, NoLoCo's)")


def groups(size: int, group_size: int, taken: int) -> list[list[int]]:
    """The round's partition of the ranks: the same on every rank (seeded by the steps taken)."""
    order = [int(r) for r in np.random.default_rng(taken + 1).permutation(size)]
    count = size // group_size
    return [order[g::count] for g in range(count)]


class NoLoCo:
    """Local steps, then each worker's outer step on its group's average (see the module)."""

    name = "noloco"
    sync_traits: ClassVar[SyncTraits] = SyncTraits(pipeline=False, per_step=False, period_key="inner_steps",
                                                   pattern="group_allreduce", recipe=RECIPE,
                                                   replicas_diverge=True)
    check_options = staticmethod(check_options)
    check_model = staticmethod(fits_any_model)
    pipeline = None
    scheduler = None

    def __init__(self, engine: Engine, stats: StepStats, inner_steps: int = 100, outer_lr: float = 0.7,
                 outer_momentum: float = 0.3, group_size: int = 2) -> None:
        check_options(inner_steps, outer_lr, outer_momentum, group_size)
        self.engine, self.stats = engine, stats
        self.inner_steps, self.outer_lr = int(inner_steps), float(outer_lr)
        self.outer_momentum = float(outer_momentum)
        # Fewer workers than a group: one group of all of them.
        self.group_size = min(int(group_size), engine.size)
        if engine.size % self.group_size:
            raise ValueError(f"sync.group_size={group_size} does not divide the {engine.size} workers; pass "
                             f"a sync.group_size that does (2 for an even number of workers)")
        self.inner = 0
        self.rounds = 0

    def setup(self, model: nn.Module) -> nn.Module:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.outer_params = [p.detach().clone() for p in self.params]  # φ_i: this worker's own
        self.momentum = [torch.zeros_like(p) for p in self.params]
        self.numel = sum(p.numel() for p in self.params)
        return model

    def make_optimizer(self, model: nn.Module, optim: dict[str, Any]) -> torch.optim.Optimizer:
        self.inner_optimizer = optimizer_over(model, self.params, optim)
        return self.inner_optimizer

    def begin_step(self, step: int, epoch: float) -> None:
        pass

    def before_backward(self) -> None:
        pass

    def synchronize(self) -> None:
        pass  # inner steps: each worker steps on its own gradients

    def after_step(self) -> None:
        self.inner += 1
        self.stats.bytes_dense += 4 * self.numel
        if self.inner == self.inner_steps:
            self.outer_step(self.rounds * self.inner_steps + self.inner)
            self.inner = 0
            self.rounds += 1

    @torch.no_grad()
    def outer_step(self, taken: int) -> None:
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        with self.stats.time("comm"):
            partition = groups(self.engine.size, self.group_size, taken)
            mean = self.engine.allreduce_group(flat, "noloco", partition)
        self.stats.add_dense_allreduce(flat.numel() * flat.element_size(), calls=1)
        with self.stats.time("optimizer"):
            pos = 0
            for p, phi, m in zip(self.params, self.outer_params, self.momentum, strict=True):
                group_mean = mean[pos : pos + p.numel()].view(p.shape)
                pos += p.numel()
                m.mul_(self.outer_momentum).add_(group_mean - phi, alpha=self.outer_lr)
                phi.add_(m)
                p.copy_(phi)

    def drain(self) -> None:
        pass  # the exchange is blocking

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "inner_steps": self.inner_steps, "outer_lr": self.outer_lr,
                "outer_momentum": self.outer_momentum, "group_size": self.group_size, "rounds": self.rounds}

    def exchange_plan(self) -> ExchangePlan:
        return ExchangePlan(every=self.inner_steps, pattern="group_allreduce", group=self.group_size)

    def state_dict(self) -> dict[str, Any]:
        # Ranks diverge: each keeps its own parameters, outer parameters, momentum and inner state.
        return {"inner": self.inner, "rounds": self.rounds,
                "outer_params": [t.clone() for t in self.outer_params],
                "momentum": [t.clone() for t in self.momentum],
                "local_params": [p.detach().clone() for p in self.params],
                "inner_optimizer": self.inner_optimizer.state_dict()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner, self.rounds = int(state["inner"]), int(state["rounds"])
        mine = [*self.outer_params, *self.momentum, *self.params]
        saved = [*state["outer_params"], *state["momentum"], *state["local_params"]]
        for t, value in zip(mine, saved, strict=True):
            t.copy_(value)
        self.inner_optimizer.load_state_dict(state["inner_optimizer"])
