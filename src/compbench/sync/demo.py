"""`sync=demo`: DeMo (Peng, Quesnelle, Kingma, 2024), decoupled momentum exchanged as a chunked DCT
top-k; the optimizer is `compbench.sync.demo_optim.DeMo` (see there for the algorithm and the
reference). It takes `optim.lr` and `optim.weight_decay` from optim=sgd (the reference is a torch SGD
whose step is the sign of the decoded momentum) and the schedule; gradients are never allreduced."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from compbench.engines.base import Engine
from compbench.stats import StepStats
from compbench.sync import SyncTraits
from compbench.sync.demo_optim import DeMo
from compbench.sync.optimizer_sync import OptimizerSync


def check_options(compression_decay: float = 0.999, compression_topk: int = 32,
                  compression_chunk: int = 64) -> None:
    """Config-time check of sync=demo's settings."""
    if isinstance(compression_decay, bool) or not isinstance(compression_decay, int | float) \
            or not 0.0 <= compression_decay < 1.0:
        raise ValueError(f"sync.compression_decay={compression_decay} must be in [0, 1); pass e.g. 0.999")
    for key, value in (("compression_topk", compression_topk), ("compression_chunk", compression_chunk)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"sync.{key}={value} must be an integer >= 1")


class DeMoSync(OptimizerSync):
    name = "demo"
    sync_traits: ClassVar[SyncTraits] = SyncTraits(pipeline=False, optimizers=("sgd",),
                                                   optimizer_keys=("lr", "weight_decay"))
    check_options = staticmethod(check_options)

    def __init__(self, engine: Engine, stats: StepStats, compression_decay: float = 0.999,
                 compression_topk: int = 32, compression_chunk: int = 64, **_: Any) -> None:
        check_options(compression_decay, compression_topk, compression_chunk)
        super().__init__(engine, stats)
        self.options: dict[str, Any] = {"compression_decay": float(compression_decay),
                        "compression_topk": int(compression_topk),
                        "compression_chunk": int(compression_chunk)}

    def build(self, params: list[nn.Parameter], optim: dict[str, Any]) -> torch.optim.Optimizer:
        return DeMo(params, engine=self.engine, stats=self.stats, lr=float(optim["lr"]),
                    weight_decay=float(optim.get("weight_decay", 0.0)), **self.options)

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, **self.options}
