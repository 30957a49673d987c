"""Runs of a synchronization mode on fixed per-rank gradients, for the oracle tests: the mode
built as the trainer builds it (composed config with its recipe, compbench.sync.build), its
optimizer stepped on `grad(rank, step, j)`, on thread ranks (tests/threaded_engine.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from compbench.catalog import registry
from compbench.compose import config
from compbench.records.stats import StepStats
from compbench.sync.build import build_synchronizer
from tests.helpers import TINY
from tests.threaded_engine import ThreadEngine, ThreadWorld

Grad = Callable[[int, int, int, torch.Size], torch.Tensor]


def run_mode(overrides: list[str], start: list[torch.Tensor], grad: Grad, steps: int, world: int = 2,
             inspect: Callable[[ThreadEngine, object, object], object] | None = None) -> list[tuple]:
    """Per rank: (parameters after the last step, bytes sent per step, inspect(engine, sync, optimizer))."""
    cfg = config.compose([*TINY, *overrides])

    def rank(engine: ThreadEngine) -> tuple:
        model = nn.ParameterList([nn.Parameter(t.clone()) for t in start])
        stats = StepStats()
        sync = build_synchronizer(cfg, engine, stats)
        sync.setup(model)
        optimizer = sync.make_optimizer(model, registry.plain(cfg.optim))
        sent = []
        for step in range(steps):
            stats.reset()
            sync.begin_step(step, 0.0)
            sync.before_backward()
            for j, p in enumerate(model):
                p.grad = grad(engine.rank, step, j, p.shape)
            sync.synchronize()
            optimizer.step()
            sync.after_step()
            sent.append(stats.bytes_sent)
        seen = inspect(engine, sync, optimizer) if inspect else None
        return [p.detach().clone() for p in model], sent, seen

    return ThreadWorld(world).run(rank)


def run_oracle(make: Callable[..., torch.optim.Optimizer], start: list[torch.Tensor], grad: Grad,
               steps: int, world: int = 2) -> list[tuple]:
    """Per rank: (parameters after the last step, bytes sent per step, the optimizer's state)."""

    def rank(engine: ThreadEngine) -> tuple:
        params = [nn.Parameter(t.clone()) for t in start]
        stats = StepStats()
        optimizer = make(params, engine=engine, stats=stats)
        sent = []
        for step in range(steps):
            stats.reset()
            for j, p in enumerate(params):
                p.grad = grad(engine.rank, step, j, p.shape)
            optimizer.step()
            sent.append(stats.bytes_sent)
        return [p.detach().clone() for p in params], sent, [optimizer.state[p] for p in params]

    return ThreadWorld(world).run(rank)
