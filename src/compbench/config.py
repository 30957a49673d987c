"""Compose the config once (Hydra compose API) and check it before anything is written.

Every user mistake found here is a ValueError whose one-line message names the fix; the CLI prints
it and exits with code 2 before any output directory exists.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from compbench import registry
from compbench.checks import check_settings
from compbench.compressors.base import check_ratio

GROUPS = ("model", "dataset", "compressor", "memory", "comm", "scheduler", "engine", "optim", "net")


def _check_group_choices(overrides: list[str]) -> None:
    for o in overrides:
        key, sep, value = o.lstrip("+~").partition("=")
        if sep and key in GROUPS and value not in registry.options(key):
            raise ValueError(f"unknown {key}={value}; choose one of: {', '.join(registry.options(key))}")


def compose(overrides: list[str], config_name: str = "train") -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    _check_group_choices(overrides)
    try:
        with initialize_config_dir(version_base=None, config_dir=str(registry.conf_dir())):
            cfg = hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{first} (settings are listed by `compbench train --cfg`)") from None
    # Keep which option each group took (reports and hparams use it); drop the rest of Hydra's node.
    picked = {g: cfg.hydra.runtime.choices[g] for g in GROUPS if g in cfg.hydra.runtime.choices}
    with open_dict(cfg):
        del cfg["hydra"]
        cfg.choices = picked
    return cfg


def check(cfg: DictConfig) -> DictConfig:
    """Validate and normalize a composed train config; returns it (ratio shorthand applied)."""
    check_settings(cfg)  # values, types, output folder (compbench.checks)
    picked = cfg.choices
    with open_dict(cfg):
        if cfg.ratio is not None:
            check_ratio(cfg.ratio, "ratio")
            if "ratio" in cfg.compressor:
                cfg.compressor.ratio = float(cfg.ratio)
            else:
                warnings.warn(f"ratio={cfg.ratio} is ignored: compressor={picked['compressor']} has no ratio",
                              stacklevel=1)
        if "ratio" in cfg.compressor:
            check_ratio(cfg.compressor.ratio, f"compressor={picked['compressor']}")
    np = cfg.engine.get("np", 1)
    if not isinstance(np, int) or np < 1:
        raise ValueError(f"engine.np={np} must be an integer >= 1 (the number of workers)")
    for key in ("epochs", "batch_size", "eval_batch_size"):
        if not isinstance(cfg[key], int) or cfg[key] < 1:
            raise ValueError(f"{key}={cfg[key]} must be an integer >= 1")

    if cfg.resume == "auto" and not cfg.output_dir:
        raise ValueError("resume=auto continues the run in output_dir; pass output_dir=DIR too")
    if cfg.resume and cfg.resume != "auto":
        from pathlib import Path

        from compbench.train.checkpoint import find_checkpoint

        find_checkpoint(cfg.resume, Path("."))
    if cfg.net.get("emulate_gbps") is not None or cfg.net.get("emulate_latency_us"):
        from compbench.netem import check as check_shaped_link

        check_shaped_link(cfg.net.get("emulate_gbps"), cfg.net.get("emulate_latency_us"))  # root, ip, tc
    if cfg.on_nonfinite not in ("raise", "skip", "ignore"):
        raise ValueError(f"on_nonfinite={cfg.on_nonfinite} is unknown; use raise, skip or ignore")

    compressor_cls = registry.component_class("compressor", picked["compressor"])
    comm_cls = registry.locate(cfg.comm._target_)
    if hasattr(comm_cls, "check"):  # engine-specific communicators (ring, ddp, horovod_optimizer)
        comm_cls.check(picked["engine"], compressor=picked["compressor"], memory=picked["memory"],
                       **{k: v for k, v in registry.plain(cfg.comm).items() if k != "_target_"})
    if getattr(comm_cls, "requires_summable", False) and not compressor_cls.summable:
        raise ValueError(f"compressor={picked['compressor']} {compressor_cls.why_not_summable}; "
                         f"use comm=allgather or comm=ps")

    # Building the light components validates their parameters (e.g. qsgd levels < 1).
    from compbench.train.build import build_compressor_and_selection, build_memory, build_model

    compressor, _ = build_compressor_and_selection(cfg)
    if hasattr(comm_cls, "check_compressor"):
        comm_cls.check_compressor(compressor)
    build_memory(cfg, np)
    registry.build(cfg.scheduler)  # e.g. scheduler.groups=foo stops here, before any output exists
    _check_dataset(cfg)
    if cfg.model.get("pretrained"):
        build_model(cfg)  # loads the file: a missing or mismatched checkpoint fails here, not in a worker
    return cfg


def _check_dataset(cfg: DictConfig) -> None:
    module = importlib.import_module(cfg.dataset._target_.rsplit(".", 1)[0])
    check_root = getattr(module, "check_root", None)
    if check_root is None:
        return
    kwargs: dict[str, Any] = {"root": cfg.dataset.get("root")}
    if "num_classes" in inspect.signature(check_root).parameters:
        kwargs["num_classes"] = cfg.dataset.num_classes
    check_root(**kwargs)


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg)
