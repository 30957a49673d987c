"""Sharded data parallelism (`sharding=fsdp|hsdp`): torch's FSDP2 (`fully_shard`) inside a shard group,
and any shardable synchronization mode across the groups.

Inside a shard group every worker holds 1/G of the parameters, gradients and optimizer state (ZeRO-3;
`stage=2` keeps the gathered parameters from forward until backward ends, ZeRO-2's parameter memory).
Each forward and backward gathers a unit's weights (`gather`: fp32, fp16/bf16, qwZ's int8 blocks,
FP8 e4m3), and backward reduce-scatters its gradients (`scatter`: fp32, fp16/bf16, qgZ's int8/int4
blocks through an all-to-all, LoCo's 4-bit with 8-bit error compensation): compbench's collectives
(compbench.sync.fsdp_comms) installed with FSDP2's `set_custom_all_gather/_reduce_scatter`.

Across the groups (HSDP: one group per node, `group_size`), the workers that hold the same shard
form a replica group, and the `sync` group's mode runs there on the shards, as it runs on whole
tensors without sharding: the per-step pipeline (allreduce or a compressor), DiLoCo and its
Streaming, SparseLoCo and quantized compositions. It sees a *shard view*: a module whose parameters
are this worker's local shards (the same storage as FSDP's), so its optimizer, its memories and its
outer step work on shards without knowing; its engine is the world's, scoped to the replica group
(`TorchEngine.within`). With one group (`sharding=fsdp`) there is nothing to exchange across groups.

Elementwise optimizers step shard by shard exactly as on whole tensors (SGD, Adam, AdamW); those that
read a whole tensor (LAMB's trust ratio, Muon's orthogonalization) are refused at compose time
(`SHARD_OPTIMIZERS`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from compbench.codec.blockquant import BlockFormat
from compbench.engines.torch_dist import TorchEngine
from compbench.records.stats import StepStats
from compbench.sync import ExchangePlan, Synchronizer
from compbench.sync.fsdp_comms import CompbenchReduceScatter, DirectionLedger, Format, install_comms

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
        if not self.on and self != Sharding(layout="none", _target_=self._target_):
            raise ValueError("sharding.* settings apply to a sharded run: pass sharding=fsdp or "
                             "sharding=hsdp")

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


def local(t: Tensor) -> Tensor:
    """This worker's part of a tensor: a DTensor's local shard (the same storage), else the tensor."""
    return t.to_local() if isinstance(t, DTensor) else t


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP wraps one by one (each gathered and freed on its own): the members of every
    outermost nn.Sequential / nn.ModuleList of two or more modules with parameters (transformer
    blocks, ResNet stages' blocks); the root takes the rest."""
    units: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            members = [m for m in child.children() if any(True for _ in m.parameters())]
            if isinstance(child, nn.Sequential | nn.ModuleList) and len(members) >= 2:
                units.extend(members)
            else:
                visit(child)

    visit(model)
    return units


class ShardView(nn.Module):
    """A module whose parameters are a sharded model's local shards, by the same names: what the
    replica-group synchronization, its optimizer and memories see. Its parameters share storage with
    the FSDP parameters' local tensors (FSDP2 keeps that storage for the run), so a step taken here
    is the model's. `bind_grads` points each view parameter's `.grad` at the local gradient."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.pairs = [(n, p, nn.Parameter(local(p).detach(), requires_grad=p.requires_grad))
                      for n, p in model.named_parameters()]

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, nn.Parameter]]:
        for name, _, view in self.pairs:
            yield prefix + name, view

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        for _, view in self.named_parameters():
            yield view

    def bind_grads(self) -> None:
        for _, p, view in self.pairs:
            view.grad = None if p.grad is None else local(p.grad)

    def write_back(self) -> None:
        """Where the synchronization replaced a view's `.grad` by a new tensor, its values go into the
        local gradient (what the trainer's clipping and check read)."""
        for _, p, view in self.pairs:
            if p.grad is None or view.grad is None:
                continue
            if view.grad.data_ptr() != local(p.grad).data_ptr():
                local(p.grad).copy_(view.grad)


class ShardedSync:
    """A synchronization mode run across shard groups; see the module. Delegates the protocol to
    `inner` (built on the replica-group engine) and owns FSDP: the wrapping, the custom collectives
    and the bytes per direction."""

    def __init__(self, inner: Synchronizer, sharding: Sharding, engine: TorchEngine,
                 shard_engine: TorchEngine, replica_engine: TorchEngine, stats: StepStats) -> None:
        """`shard_engine`, `replica_engine`: the world's engine scoped to this rank's shard group and
        replica group (`TorchEngine.within`); `inner` runs on the replica engine."""
        self.inner, self.sharding, self.engine, self.stats = inner, sharding, engine, stats
        self.shard_engine, self.replica_engine = shard_engine, replica_engine
        self.sync_traits = inner.sync_traits
        self.pipeline, self.scheduler = inner.pipeline, inner.scheduler
        self.directions = DirectionLedger(stats, engine.local_size)
        self.model: nn.Module | None = None
        self.view: ShardView | None = None
        self.scatters: list[CompbenchReduceScatter] = []

    @staticmethod
    def check_model(model: nn.Module, **options: Any) -> None:
        """Checked by the inner mode (compose/config.py calls the `sync` group's)."""

    @property
    def replicas(self) -> int:
        return self.replica_engine.size

    def setup(self, model: nn.Module) -> nn.Module:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        s = self.sharding
        mesh = DeviceMesh.from_group(self.shard_engine.group, self.engine.device.type)
        # stage 3 frees a unit's gathered weights after its forward; hpZ keeps a secondary shard per
        # node instead (FSDP2 reshards to the node's workers), so backward gathers inside the node
        after_forward: bool | int = (self.engine.local_size if s.hpz else True) if s.stage == 3 else False
        # fully_shard returns the module itself, as an FSDPModule (its class swapped in place)
        units = [fully_shard(u, mesh=mesh, reshard_after_forward=after_forward) for u in shard_units(model)]
        # the root last: it takes the parameters no unit holds
        wrapped = [*units, fully_shard(model, mesh=mesh, reshard_after_forward=after_forward)]
        self.scatters = install_comms(wrapped, s.gather_format(), s.scatter_format(), s.scatter == "loco4",
                                      self.directions, self.engine.device)
        if s.prefetch:
            for i, unit in enumerate(units):  # gather the next units' weights while this one computes
                unit.set_modules_to_forward_prefetch(units[i + 1: i + 1 + s.prefetch])
                unit.set_modules_to_backward_prefetch(list(reversed(units[max(0, i - s.prefetch): i])))
        self.model, self.view = model, ShardView(model)
        self.inner.setup(self.view)
        return model

    def make_optimizer(self, model: nn.Module, optim: dict[str, Any]) -> torch.optim.Optimizer:
        assert self.view is not None, "setup first"
        return self.inner.make_optimizer(self.view, optim)

    def begin_step(self, step: int, epoch: float) -> None:
        self.directions.begin_step()
        self.inner.begin_step(step, epoch)

    def before_backward(self) -> None:
        # The optimizer zeroed the view's gradients; FSDP accumulates into its own unless they are
        # gone (a reduce-scatter adds to an existing sharded .grad).
        assert self.model is not None
        self.model.zero_grad(set_to_none=True)
        self.inner.before_backward()

    def synchronize(self) -> None:
        assert self.view is not None
        self.view.bind_grads()
        if self.replicas > 1 or self.inner.pipeline is None:
            self.inner.synchronize()
            self.view.write_back()

    def after_step(self) -> None:
        self.inner.after_step()

    def drain(self) -> None:
        self.inner.drain()

    def summary(self) -> dict[str, Any]:
        return self.inner.summary()

    def exchange_plan(self) -> ExchangePlan:
        return self.inner.exchange_plan()

    def state_dict(self) -> dict[str, Any]:
        """The mode's per-rank state, and LoCo's compressed errors (each unit's, this rank's)."""
        return {**self.inner.state_dict(), "scatter": [rs.state_dict() for rs in self.scatters]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for rs, saved in zip(self.scatters, state.get("scatter", []), strict=True):
            rs.load_state_dict(saved)
        self.inner.load_state_dict({k: v for k, v in state.items() if k != "scatter"})

    def record(self) -> dict[str, Any]:
        """results.json's `sharded`: the layout as it ran."""
        s = self.sharding
        return {"layout": s.layout, "stage": s.stage, "shard_group": self.shard_engine.size,
                "replicas": self.replicas, "gather": s.gather, "scatter": s.scatter, "hpz": s.hpz,
                "prefetch": s.prefetch}
