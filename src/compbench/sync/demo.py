"""`sync=demo`: DeMo (Peng, Quesnelle, Kingma, 2024; reference bloc97/DeMo `demo.py`) through
compbench's pipeline. Every step, each rank's own gradients go through memory -> compressor ->
communicator (a per-step mode: `step`'s scheduler and pipeline), and the optimizer steps by the sign
of the average. In DeMo's terms:

    memory=residual (beta = the decay, gamma x the learning rate)   delta = decay * delta + lr * g
    compressor=chunk_dct                                             q = the top-k DCT coefficients of
                                                                    each chunk of delta
    the memory's update (what was sent leaves it)                  delta -= IDCT(q)
    comm=allgather, the compressor's mean over senders              Q = every rank's q, each
                                                                    coefficient averaged over the
                                                                    ranks that sent it
    the optimizer (`DeMoStep`)                                      p *= 1 - lr * weight_decay;
                                                                    p -= lr * sign(IDCT(Q))

The learning rate enters the memory through `scale_input` before each step, so it follows the
schedule as the reference's does. The recipe (`RECIPE`, applied unless the user sets the key):
compressor=chunk_dct, memory=residual with memory.beta=0.999 (the reference's decay), comm=allgather,
scheduler=bucket (the whole model's coefficients in one allgather). Any compressor, memory and
communicator can take their place (DeMo's DCT against top-k: compressor=topk). The optimizer takes
`optim.lr` and `optim.weight_decay` from optim=sgd and the schedule, with no weight decay unless the
user sets optim.weight_decay (the recipe: the reference's default, not optim=sgd's 5e-4).

The former implementation, which exchanged inside its own optimizer step, is the test oracle
(tests/oracles/demo.py): this mode reproduces its parameters and momenta bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from compbench.memory.base import ScalesInput
from compbench.sync import SyncTraits
from compbench.sync.step import StepSync

# No weight decay unless the user sets it: the reference's DeMo defaults to weight_decay=0.
RECIPE = {"compressor": "chunk_dct", "memory": "residual", "memory.beta": 0.999, "comm": "allgather",
          "scheduler": "bucket", "optim.weight_decay": 0.0}


class DeMoStep(torch.optim.Optimizer):
    """DeMo's update rule alone (its exchange is the pipeline's): decoupled weight decay, then a step
    of `lr` along the sign of `p.grad`, which holds the averaged, decoded momentum."""

    def __init__(self, params: Iterable[Any], lr: float, weight_decay: float = 0.0) -> None:
        if not lr >= 0.0 or not weight_decay >= 0.0:
            raise ValueError(f"sync=demo: optim.lr={lr} and optim.weight_decay={weight_decay} must be >= 0")
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]  # torch's overloads
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, decay = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if decay != 0.0:
                    p.mul_(1.0 - lr * decay)
                p.add_(p.grad.sign(), alpha=-lr)
        return loss


class DeMoSync(StepSync):
    name = "demo"
    sync_traits: ClassVar[SyncTraits] = SyncTraits(optimizers=("sgd",), optimizer_keys=("lr", "weight_decay"),
                                                   recipe=RECIPE)

    def make_optimizer(self, model: nn.Module, optim: dict[str, Any]) -> torch.optim.Optimizer:
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = DeMoStep(params, lr=float(optim["lr"]),
                                  weight_decay=float(optim.get("weight_decay", 0.0)))
        return self.optimizer

    def begin_step(self, step: int, epoch: float) -> None:
        super().begin_step(step, epoch)
        memory = self.pipeline.memory
        if isinstance(memory, ScalesInput):  # DeMo's momentum takes lr * g (the step's scheduled lr)
            memory.scale_input(self.optimizer.param_groups[0]["lr"])
