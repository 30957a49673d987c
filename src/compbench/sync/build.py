"""The one place the synchronization is assembled, for the trainer, `wrap_compress_optimizer` and
tests: compressor, memory, communicator and scheduler built from their config nodes and handed to the
synchronization mode (`sync` group); a mode without compbench's pipeline (`sync_traits.pipeline`
false: DDP's hooks, Horovod's optimizer) gets only the engine and the statistics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from compbench.catalog import registry
from compbench.engines.base import Engine
from compbench.engines.torch_dist import TorchEngine
from compbench.records.stats import StepStats
from compbench.seam.build import build_compressor_and_selection, build_memory
from compbench.seam.pipeline import GradientPipeline
from compbench.sync import Synchronizer
from compbench.sync.sharding import Sharding, groups_of

STEP_SYNC = {"_target_": "compbench.sync.step.StepSync"}


def build_synchronizer(nodes: Mapping[str, Any], engine: Engine, stats: StepStats, *,
                       guard_nonfinite: bool = False) -> Synchronizer:
    """`nodes`: the config nodes of compressor, memory, comm, scheduler and (optionally) sync and
    sharding.

    `guard_nonfinite`: with on_nonfinite=skip an overlapping scheduler compresses groups inside
    backward, before the trainer's finiteness check: the pipeline then refuses non-finite groups
    itself so that no NaN enters error-feedback memory.

    A sharded run (`sharding=fsdp|hsdp`) builds the mode on the engine scoped to its replica group
    (the workers that hold the same shard) and wraps it in ShardedSync, which owns FSDP."""
    cfg = nodes if isinstance(nodes, DictConfig) else OmegaConf.create(dict(nodes))
    sharding = Sharding(**registry.plain(cfg.sharding)) if cfg.get("sharding") else Sharding()
    if not sharding.on:
        return _build_mode(cfg, engine, stats, guard_nonfinite)
    if not isinstance(engine, TorchEngine):
        raise ValueError("sharding runs on torch.distributed (FSDP2): add engine=torch")
    from compbench.sync.sharded import ShardedSync  # FSDP's modules: imported by sharded runs only

    size = sharding.shard_size(engine.size, engine.local_size)
    shards, replicas = groups_of(engine.size, size)
    shard_engine, replica_engine = engine.within(shards), engine.within(replicas)
    inner = _build_mode(cfg, replica_engine, stats, guard_nonfinite)
    # a ShardedSync's traits are its inner mode's, per instance (the protocol's are per class)
    return cast(Synchronizer, ShardedSync(inner, sharding, engine, shard_engine, replica_engine, stats))


def _build_mode(cfg: DictConfig, engine: Engine, stats: StepStats, guard_nonfinite: bool) -> Synchronizer:
    sync_node = cfg.get("sync") or STEP_SYNC
    if not registry.locate(sync_node["_target_"]).sync_traits.pipeline:
        return registry.build(sync_node, engine=engine, stats=stats)
    compressor, selection = build_compressor_and_selection(cfg)
    comm = registry.build(cfg.comm, engine=engine, compressor=compressor, stats=stats)
    memory = build_memory(cfg, engine.size)
    pipeline = GradientPipeline(engine, compressor, memory, comm, selection, stats)
    pipeline.guard_nonfinite = guard_nonfinite
    return registry.build(sync_node, pipeline=pipeline, scheduler=registry.build(cfg.scheduler),
                          engine=engine, stats=stats)
