"""Learning-rate schedules with linear warm-up (constant, cosine, step), per optimizer step."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from compbench.base.values import show

SCHEDULE_KEYS = ("lr_schedule", "warmup_epochs", "warmup_steps", "lr_min_factor", "lr_step_epochs",
                 "lr_gamma")


def build_schedule(optimizer: torch.optim.Optimizer, steps_per_epoch: int, epochs: int,
                   lr_schedule: str = "constant", warmup_epochs: float = 0.0, lr_min_factor: float = 0.0,
                   lr_step_epochs: list[int] | None = None, lr_gamma: float = 0.1, warmup_steps: int = 0,
                   **_: Any) -> LambdaLR:
    """The schedule, its linear warm-up over `warmup_steps` steps where that is set (> 0), else over
    `warmup_epochs` epochs."""
    total = max(1, steps_per_epoch * epochs)
    warm = int(warmup_steps) if warmup_steps else int(warmup_epochs * steps_per_epoch)
    steps = [int(e * steps_per_epoch) for e in (lr_step_epochs or [])]
    if lr_schedule not in ("constant", "cosine", "step"):
        raise ValueError(f"optim.lr_schedule={show(lr_schedule)} is unknown; use constant, cosine or step")

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if lr_schedule == "cosine":
            t = (step - warm) / max(1, total - warm)
            return lr_min_factor + (1 - lr_min_factor) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))
        if lr_schedule == "step":
            return lr_gamma ** sum(step >= s for s in steps)
        return 1.0

    return LambdaLR(optimizer, factor)
