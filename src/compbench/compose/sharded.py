"""Compose-time checks of a sharded run (`sharding=fsdp|hsdp`) and of whether a model fits this
machine's memory at all: one `ValueError` line naming the key and the fix, before anything is written
or allocated (the model is built on the meta device)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from torch import nn

from compbench.catalog import registry
from compbench.engines.device import local_workers
from compbench.records.memory import predict_worker_bytes
from compbench.sync import SyncTraits
from compbench.sync.sharding import SHARD_OPTIMIZERS, Sharding
from compbench.train.checkpoint import world_size

GB = 1e9


def job_layout(cfg: DictConfig) -> tuple[int, int]:
    """(workers, workers on this machine) of the job: an external launcher's (torchrun on each node of
    `compbench cluster`), else engine.np, which compbench starts all here."""
    return world_size(cfg), local_workers(int(cfg.engine.get("np", 1)))


def check_sharding(cfg: DictConfig, sync: SyncTraits) -> Sharding:
    """The sharding settings against the rest of the run; returns them."""
    picked = cfg.choices
    sharding = Sharding(**registry.plain(cfg.sharding))
    sharding.check()
    if not sharding.on:
        return sharding
    layout = f"sharding={picked['sharding']}"
    if picked["engine"] != "torch":
        raise ValueError(f"{layout} runs on torch.distributed (FSDP2's fully_shard): add engine=torch")
    if cfg.engine.get("elastic"):
        raise ValueError(f"{layout} with engine.elastic=true: a sharded model's shards are fixed to its "
                         "workers while it trains (resume onto another number of workers from a "
                         "checkpoint instead); drop engine.elastic")
    world, local = job_layout(cfg)
    sharding.check_world(world, local)
    if not sync.shards:
        raise ValueError(f"sync={picked['sync']} does not run across shard groups: {layout} takes sync=step "
                         "(allreduce or a compressor across groups) or sync=diloco and its compositions")
    if picked["optim"] not in SHARD_OPTIMIZERS:
        raise ValueError(f"optim={picked['optim']} reads whole tensors, and a worker holds shards under "
                         f"{layout}: use optim={' / '.join(SHARD_OPTIMIZERS)}")
    scheduler = registry.locate(cfg.scheduler._target_).traits
    if scheduler.fuses or scheduler.partitions:
        raise ValueError(f"scheduler={picked['scheduler']} fuses gradients into buffers of its own; across "
                         f"shard groups the shards go tensor by tensor: drop scheduler=")
    if sharding.shard_size(world, local) == world:
        defaults = (("compressor", "none"), ("memory", "none"), ("comm", "allreduce"), ("sync", "step"))
        for group, default in defaults:
            if picked[group] != default:
                raise ValueError(f"sharding=fsdp makes one shard group of all {world} workers: nothing "
                                 f"crosses groups, so {group}={picked[group]} would not be used; compress "
                                 f"FSDP's own collectives (sharding.gather=int8, sharding.scatter=int8) or "
                                 f"pass sharding=hsdp")
    return sharding


def check_fits(cfg: DictConfig, model: nn.Module, sharding: Sharding) -> None:
    """Refuse a run whose workers on this machine cannot hold their parameters, gradients and
    optimizer state (a lower bound: activations come on top), before any allocation."""
    available = _available_bytes()
    if available is None:
        return
    world, local = job_layout(cfg)
    shards = sharding.shard_size(world, local) if sharding.on else 1
    numel = sum(p.numel() for p in model.parameters())
    optim = registry.plain(cfg.optim)
    need = predict_worker_bytes(numel, cfg.choices["optim"], optim, shards)
    if need["total"] * local <= available:
        return
    parts = (f"parameters {need['parameters'] / GB:.1f} + gradients {need['gradients'] / GB:.1f} + "
             f"optim={cfg.choices['optim']} state {need['optimizer'] / GB:.1f} GB")
    fix = "lower the model's size or engine.np"
    if not sharding.on and world > 1:
        sharded = predict_worker_bytes(numel, cfg.choices["optim"], optim, world)["total"]
        fix = f"shard it: sharding=fsdp engine=torch holds {sharded / GB:.1f} GB per worker"
    raise ValueError(f"model={cfg.choices['model']} ({numel / 1e9:.2f}B parameters) needs at least "
                     f"{need['total'] / GB:.1f} GB per worker ({parts}), {need['total'] * local / GB:.1f} GB "
                     f"for {local} workers on this machine, which has {available / GB:.1f} GB available; "
                     f"{fix}")


def _available_bytes() -> int | None:
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None
