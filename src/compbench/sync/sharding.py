"""The `sharding` group's settings (`sharding=none|fsdp|hsdp`), checked in one place, and the layout of
shard and replica groups: what the config check, the builder and the trainer read of a sharded run
without importing FSDP (torch.distributed's FSDP and DTensor modules cost most of a second to import:
compbench.sync.sharded, which uses them, is imported only by a sharded run)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from compbench.codec.blockquant import BlockFormat

# A collective's wire format: a block quantizer, a dense cast, or fp32 as it is (None).
Format = BlockFormat | torch.dtype | None
DIRECTIONS = ("gathered", "scattered")  # FSDP's two collectives: weights gathered, gradients scattered
LAYOUTS = ("none", "fsdp", "hsdp")
GATHER_FORMATS = ("none", "fp16", "bf16", "int8", "fp8")
SCATTER_FORMATS = ("none", "fp16", "bf16", "int8", "int4", "loco4")
SCALE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_CASTS = {"fp16": torch.float16, "bf16": torch.bfloat16}
# Optimizers whose update of an element reads only that element's state: a shard steps as the whole.
SHARD_OPTIMIZERS = ("sgd", "adam", "adamw")


@dataclass(frozen=True)
class Sharding:
    """The `sharding` group's settings, checked once (`check`) at compose time; see conf/sharding/."""

    layout: str = "none"
    stage: int = 3
    group_size: int | str = "node"
    gather: str = "none"
    gather_block: int = 2048
    gather_stochastic: bool = False
    scatter: str = "none"
    scatter_block: int = 2048
    scale_dtype: str = "fp32"
    hpz: bool = False
    prefetch: int = 1
    _target_: str = ""

    @property
    def on(self) -> bool:
        return self.layout != "none"

    def check(self) -> None:
        """ValueError (one line, naming the key and the fix) for a setting that cannot run."""
        choices = (("layout", self.layout, LAYOUTS), ("gather", self.gather, GATHER_FORMATS),
                   ("scatter", self.scatter, SCATTER_FORMATS),
                   ("scale_dtype", self.scale_dtype, tuple(SCALE_DTYPES)))
        for key, value, allowed in choices:
            if value not in allowed:
                # compbench's compressors send whole tensors' payloads, not a chunk per peer that
                # the receiver sums: they compress what crosses shard groups, not FSDP's collectives
                across = (f"; a compressor (compressor={value}) compresses what crosses shard groups: "
                          f"sharding=hsdp compressor={value}" if key in ("gather", "scatter") else "")
                raise ValueError(f"sharding.{key}={value} is not one of {', '.join(allowed)}{across}")
        if self.stage not in (2, 3):
            raise ValueError(f"sharding.stage={self.stage} must be 3 (ZeRO-3: parameters resharded after "
                             "forward) or 2 (kept until backward ends); ZeRO-1 sends what stage 2 sends and "
                             "keeps whole gradients: pass sharding.stage=2")
        for key, block in (("gather_block", self.gather_block), ("scatter_block", self.scatter_block)):
            if not isinstance(block, int) or isinstance(block, bool) or block < 0:
                raise ValueError(f"sharding.{key}={block} must be a whole number of elements per scale "
                                 "(0: one scale per tensor)")
        if self.gather_stochastic and self.gather != "int8":
            raise ValueError(f"sharding.gather_stochastic=true rounds int8 codes (QSDP); sharding.gather="
                             f"{self.gather} has none: pass sharding.gather=int8")
        if self.scatter in ("int4", "loco4") and self.scatter_block == 0:
            raise ValueError(f"sharding.scatter={self.scatter} needs blocks (4 bits hold too little range "
                             "for one scale per tensor); set sharding.scatter_block, e.g. 2048")
        if self.hpz and self.stage != 3:
            raise ValueError("sharding.hpz=true is a secondary shard kept after forward; sharding.stage=2 "
                             "keeps the whole weights until backward ends: drop sharding.hpz or pass "
                             "sharding.stage=3")
        if not isinstance(self.prefetch, int) or isinstance(self.prefetch, bool) or self.prefetch < 0:
            raise ValueError(f"sharding.prefetch={self.prefetch} must be a number of units (0: FSDP's own)")

    def gather_format(self) -> Format:
        if self.gather in ("none", *_CASTS):
            return _CASTS.get(self.gather)
        kind = "fp8_e4m3" if self.gather == "fp8" else "int8"
        return BlockFormat(kind, self.gather_block, SCALE_DTYPES[self.scale_dtype], self.gather_stochastic)

    def scatter_format(self) -> Format:
        if self.scatter in ("none", *_CASTS):
            return _CASTS.get(self.scatter)
        kind = "int8" if self.scatter == "int8" else "int4"
        return BlockFormat(kind, self.scatter_block, SCALE_DTYPES[self.scale_dtype])

    def shard_size(self, world: int, local_size: int) -> int:
        """Workers per shard group: the world (fsdp), a node's workers or `group_size` (hsdp)."""
        if self.layout == "fsdp":
            return world
        size = local_size if self.group_size == "node" else int(self.group_size)
        return size

    def check_world(self, world: int, local_size: int) -> None:
        """The layout against the job's workers and nodes (compose time, and again in the workers)."""
        if self.layout != "hsdp":
            if self.hpz and local_size >= world:
                raise ValueError(f"sharding.hpz=true keeps a secondary shard per node where the shard "
                                 f"group spans nodes, and this job's {world} workers are one node: drop "
                                 f"sharding.hpz or run on `compbench cluster` with 2 or more nodes")
            if self.group_size != "node":
                raise ValueError("sharding.group_size shapes HSDP's groups; sharding=fsdp shards over every "
                                 "worker: drop sharding.group_size or pass sharding=hsdp")
            return
        if self.group_size == "node" and local_size >= world:
            raise ValueError(f"sharding=hsdp shards inside each node and replicates across nodes, and this "
                             f"job has one node ({world} workers): run it on `compbench cluster` with 2 or "
                             f"more nodes, or set sharding.group_size=K to make each K workers a group")
        size = self.shard_size(world, local_size)
        if isinstance(size, bool) or size < 1 or world % size or size == world:
            raise ValueError(f"sharding.group_size={self.group_size} must divide the {world} workers into 2 "
                             f"or more groups (e.g. sharding.group_size={max(1, world // 2)})")
        if self.hpz:
            raise ValueError("sharding.hpz=true keeps a secondary shard per node inside one group that spans "
                             "nodes (sharding=fsdp across nodes); with sharding=hsdp the groups are nodes "
                             "already: drop sharding.hpz")


def groups_of(world: int, size: int) -> tuple[list[list[int]], list[list[int]]]:
    """(shard groups, replica groups): consecutive ranks shard together (a node's); ranks at the same
    position in their shard group hold the same shard and replicate it."""
    shards = [list(range(g, g + size)) for g in range(0, world, size)]
    replicas = [list(range(i, world, size)) for i in range(size)]
    return shards, replicas
