"""Distributed engines: Horovod and torch.distributed behind one small interface."""

from compbench.engines.base import Engine, Handle

__all__ = ["Engine", "Handle"]
