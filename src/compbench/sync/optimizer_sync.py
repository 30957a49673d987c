"""The optimizer-level modes' shared part: the optimizer decides what is exchanged, inside its own
`step` (DeMo's DCT top-k of its momentum, 1-bit Adam's compressed momentum), so the trainer's
gradients stay local and the synchronizer only builds that optimizer and saves its state per rank
(error buffers and momenta differ between ranks)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from compbench.engines.base import Engine
from compbench.stats import StepStats
from compbench.sync import SyncTraits


class OptimizerSync:
    """Subclasses set `name`, `sync_traits` and `build(params, optim)`."""

    name: ClassVar[str]
    sync_traits: ClassVar[SyncTraits]
    pipeline = None
    scheduler = None

    def __init__(self, engine: Engine, stats: StepStats, **_: Any) -> None:
        self.engine, self.stats = engine, stats

    def build(self, params: list[nn.Parameter], optim: dict[str, Any]) -> torch.optim.Optimizer:
        raise NotImplementedError

    def setup(self, model: nn.Module) -> nn.Module:
        return model

    def make_optimizer(self, model: nn.Module, optim: dict[str, Any]) -> torch.optim.Optimizer:
        self.optimizer = self.build([p for p in model.parameters() if p.requires_grad], optim)
        return self.optimizer

    def begin_step(self, step: int, epoch: float) -> None:
        pass

    def before_backward(self) -> None:
        pass

    def synchronize(self) -> None:
        pass  # the optimizer's step exchanges

    def after_step(self) -> None:
        pass

    def drain(self) -> None:
        pass

    def summary(self) -> dict[str, Any]:
        return {"name": self.name}

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict()}  # this rank's own

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
