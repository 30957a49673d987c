"""Build the run's parts from the composed config (components get flat keyword arguments)."""

from __future__ import annotations

import inspect
from typing import Any

from omegaconf import DictConfig
from torch import nn

from compbench.catalog import registry
from compbench.compressors import SELECTION_KEYS
from compbench.seam.selection import Selection


def build_compressor_and_selection(cfg: DictConfig) -> tuple[Any, Selection]:
    node = registry.plain(cfg.compressor)
    selection = Selection(**{k: node[k] for k in SELECTION_KEYS if k in node})
    return registry.build(node, drop=SELECTION_KEYS), selection


def build_memory(cfg: DictConfig, world_size: int) -> Any:
    node = registry.plain(cfg.memory)
    cls = registry.locate(node["_target_"])
    takes_size = "world_size" in inspect.signature(cls).parameters
    extra: dict[str, Any] = {"world_size": world_size} if takes_size else {}
    return registry.build(node, **extra)


def build_model(cfg: DictConfig) -> nn.Module:
    return registry.build(cfg.model)


def build_datasets(cfg: DictConfig):
    return registry.build(cfg.dataset)
