"""`wrap_compress_optimizer`: compbench's pipeline inside a user's own training script.

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = compbench.wrap_compress_optimizer(model, optimizer, compressor="dragonn", ratio=1e-3)
    ...; loss.backward(); optimizer.step()      # gradients are compressed, exchanged and averaged

Run the script under `horovodrun -np 2 python train.py` or `compbench launch -np 2 train.py`.
It is assembled by the same function as `compbench train` (compbench.sync.build).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import nn

from compbench.catalog import registry
from compbench.compose import compat
from compbench.records.stats import StepStats
from compbench.seam.build import build_compressor_and_selection
from compbench.sync import Synchronizer
from compbench.sync.build import build_synchronizer


class CompressedOptimizer:
    """The user's optimizer, with gradient synchronization through compbench before each step."""

    def __init__(self, optimizer: torch.optim.Optimizer, sync: Synchronizer, stats: StepStats) -> None:
        self.optimizer, self.sync, self.stats = optimizer, sync, stats
        self.steps = 0
        self._armed = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clears the gradients and arms the scheduler for the coming backward (overlap)."""
        self.optimizer.zero_grad(set_to_none=set_to_none)
        self._arm()

    def _arm(self) -> None:
        self.stats.reset()
        self.sync.begin_step(self.steps, 0.0)
        self.sync.before_backward()
        self._armed = True

    def synchronize(self) -> None:
        """Compress, exchange and average the gradients now (step() calls it)."""
        if not self._armed:  # zero_grad was not called through the wrapper
            self._arm()
        self.sync.synchronize()
        self._armed = False

    def step(self, closure=None):
        self.synchronize()
        self.steps += 1
        return self.optimizer.step(closure)

    # zero_grad, param_groups, state_dict, ... of the user's optimizer
    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


def wrap_compress_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, *, compressor: str = "none",
                            memory: str = "none", comm: str = "allgather", scheduler: str = "layerwise",
                            engine: str = "horovod", broadcast_parameters: bool = True,
                            scheduler_options: dict[str, Any] | None = None,
                            **compressor_params: Any) -> CompressedOptimizer:
    """Wrap `optimizer` so that `step()` first averages gradients through compressor/memory/comm.

    `compressor_params` override the compressor's config (e.g. ratio=1e-3, compress_threshold=0);
    `scheduler_options` the scheduler's (e.g. {"overlap": False} for gradient accumulation).
    The engine joins the job the launcher described (horovodrun, torchrun or `compbench launch`).
    """
    defaults = registry.option_config("compressor", compressor)
    if "ratio" in compressor_params and "ratio" not in defaults:
        warnings.warn(f"ratio is ignored: compressor={compressor} has no ratio", stacklevel=2)
        compressor_params.pop("ratio")
    cfg = OmegaConf.create({
        "compressor": {**defaults, **compressor_params},
        "memory": registry.option_config("memory", memory),
    })
    comm_cls = registry.component_class("comm", comm)
    caps = build_compressor_and_selection(cfg)[0].caps  # the built one's: a setting may change them
    memory_traits = registry.declared("memory", memory)
    optim_name = type(optimizer).__name__.lower()
    momentum = optimizer.param_groups[0].get("momentum", 0.0)
    choices = {"compressor": compressor, "memory": memory, "comm": comm, "scheduler": scheduler,
               "engine": engine, "optim": optim_name}
    compat.check(choices, caps, memory_traits, comm_cls.traits,
                 registry.declared("scheduler", scheduler), {"momentum": momentum})
    if memory_traits.owns_momentum and momentum:
        raise ValueError(f"memory={memory} applies momentum itself: build your optimizer with momentum=0")
    eng = registry.build(registry.option_config("engine", engine), drop=("np",))
    stats = StepStats()
    cfg.comm = registry.option_config("comm", comm)
    cfg.scheduler = {**registry.option_config("scheduler", scheduler), **(scheduler_options or {})}
    sync = build_synchronizer(cfg, eng, stats)
    sync.setup(model)
    if broadcast_parameters:
        with torch.no_grad():
            for name, t in [*model.named_parameters(), *model.named_buffers()]:
                eng.broadcast_(t.data, 0, f"init.{name}")
    return CompressedOptimizer(optimizer, sync, stats)
