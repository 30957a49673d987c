"""Lazy component registry: the Hydra config folders are the registry.

`conf/<group>/<name>.yaml` names an option; its `_target_` says which class builds it. Nothing is
imported until a component is built, so optional dependencies (CuPy, Horovod) are loaded only by the
component that needs them and every CPU path works without them.
"""

from __future__ import annotations

import importlib
import inspect
import os
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


def conf_dir() -> Path:
    """The `conf/` folder: $COMPBENCH_CONF_DIR, else the repository's (editable install)."""
    env = os.environ.get("COMPBENCH_CONF_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "conf"
    if not (path / "train.yaml").is_file():
        raise ValueError(f"no compbench config at {path}; set COMPBENCH_CONF_DIR to the repository's conf/")
    return path


def options(group: str) -> list[str]:
    """Names of the options of a config group, sorted."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


@cache
def option_config(group: str, name: str) -> dict[str, Any]:
    path = conf_dir() / group / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown {group}={name}; choose one of: {', '.join(options(group))}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)  # type: ignore[return-value]


def locate(target: str) -> Any:
    module, _, attr = target.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def component_class(group: str, name: str) -> Any:  # a located class: its `traits`/`caps` are read
    return locate(option_config(group, name)["_target_"])


def plain(cfg: DictConfig | dict[str, Any]) -> dict[str, Any]:
    """A config node as a plain dict (components never see a DictConfig)."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    return dict(cfg)


def check_settings(cfg: DictConfig | dict[str, Any], who: str, *, drop: tuple[str, ...] = (),
                   passed: tuple[str, ...] = ()) -> None:
    """ValueError naming the first key of the node that its `_target_` does not take (a typo such as
    `+compressor.ratoi=...`, which Hydra's `+` lets through): the key would otherwise fail inside
    a worker. `drop`: keys the caller removes; `passed`: arguments the caller supplies itself."""
    kwargs = plain(cfg)
    params = inspect.signature(locate(kwargs.pop("_target_"))).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    takes = [k for k in params if k not in passed]
    unknown = [k for k in kwargs if k not in drop and k not in takes]
    if unknown:
        group = who.partition("=")[0]
        settings = ", ".join([*takes, *drop])
        raise ValueError(f"{group}.{unknown[0]} is not a setting of {who}; "
                         + (f"its settings are: {settings}" if settings else "it takes none"))


def build(cfg: DictConfig | dict[str, Any], *, drop: tuple[str, ...] = (), **extra: Any) -> Any:
    """Instantiate `_target_` with the node's other keys as flat keyword arguments."""
    kwargs = plain(cfg)
    target = kwargs.pop("_target_")
    for key in drop:
        kwargs.pop(key, None)
    return locate(target)(**kwargs, **extra)
