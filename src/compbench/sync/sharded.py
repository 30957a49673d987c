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
(`compbench.sync.sharding.SHARD_OPTIMIZERS`). The settings and the groups' layout are
compbench.sync.sharding's (imported without FSDP).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from compbench.engines.torch_dist import TorchEngine
from compbench.records.stats import StepStats
from compbench.sync import ExchangePlan, Synchronizer
from compbench.sync.fsdp_comms import CompbenchReduceScatter, DirectionLedger, install_comms
from compbench.sync.sharding import Sharding


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
