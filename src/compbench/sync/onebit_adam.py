"""`sync=onebit_adam`: 1-bit Adam (Tang et al., ICML 2021), dense Adam for `freeze_step` steps, then
the momentum exchanged in 1 bit per element with worker and server error feedback; the optimizer is
`compbench.sync.onebit_adam_optim.OnebitAdam` (see there for the algorithm and the reference). It
takes `optim.lr`, `optim.betas` and `optim.weight_decay` from optim=adamw (the reference's decay is
decoupled, as AdamW's) and the schedule; gradients are never allreduced by the trainer."""

from __future__ import annotations

from typing import Any, ClassVar, cast

import torch
from torch import nn

from compbench.engines.base import Engine
from compbench.stats import StepStats
from compbench.sync import SyncTraits
from compbench.sync.onebit_adam_optim import OnebitAdam
from compbench.sync.optimizer_sync import OptimizerSync


def check_options(freeze_step: int = 100, eps: float = 1e-8) -> None:
    """Config-time check of sync=onebit_adam's settings."""
    if isinstance(freeze_step, bool) or not isinstance(freeze_step, int) or freeze_step < 0:
        raise ValueError(f"sync.freeze_step={freeze_step} must be an integer >= 0 (dense warm-up steps)")
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps > 0:
        raise ValueError(f"sync.eps={eps} must be a number > 0; pass e.g. sync.eps=1e-8")


class OnebitAdamSync(OptimizerSync):
    name = "onebit_adam"
    sync_traits: ClassVar[SyncTraits] = SyncTraits(pipeline=False, optimizers=("adamw",),
                                                   optimizer_keys=("lr", "betas", "weight_decay"))
    check_options = staticmethod(check_options)

    def __init__(self, engine: Engine, stats: StepStats, freeze_step: int = 100, eps: float = 1e-8,
                 **_: Any) -> None:
        check_options(freeze_step, eps)
        super().__init__(engine, stats)
        self.freeze_step, self.eps = int(freeze_step), float(eps)

    def build(self, params: list[nn.Parameter], optim: dict[str, Any]) -> torch.optim.Optimizer:
        return OnebitAdam(params, engine=self.engine, stats=self.stats, lr=float(optim["lr"]),
                          betas=tuple(optim.get("betas", (0.9, 0.999))), eps=self.eps,
                          weight_decay=float(optim.get("weight_decay", 0.0)), freeze_step=self.freeze_step)

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "freeze_step": self.freeze_step, "eps": self.eps,
                "frozen": bool(cast(OnebitAdam, self.optimizer).frozen)}
