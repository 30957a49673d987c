"""`engine=horovod`: Horovod collectives (Gloo on CPU, NCCL on GPU), as the seeds use."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from compbench.engines.base import EngineBase, Handle


class HorovodEngine(EngineBase):
    """Joins the Horovod job described by the environment (horovodrun or compbench's launcher)."""

    name = "horovod"

    def __init__(self) -> None:
        import horovod.torch as hvd

        self.hvd = hvd
        hvd.init()
        self.rank, self.size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
        self.local_size = hvd.local_size()

    # Horovod matches operations across ranks by name. Names only need to be unique among operations
    # in flight, and stable names (one per tensor) let Horovod's response cache skip negotiation.

    def allreduce_async(self, t: Tensor, name: str, average: bool = True) -> Handle:
        op = self.hvd.Average if average else self.hvd.Sum
        h = self.hvd.allreduce_async(t, name=name, op=op)
        return Handle(lambda: self.hvd.synchronize(h))

    def allreduce_inplace_async(self, t: Tensor, name: str) -> Handle:
        # Horovod averages while copying out of its fusion buffer: no pass of our own.
        h = self.hvd.allreduce_async_(t, name=name, op=self.hvd.Average)
        return Handle(lambda: self.hvd.synchronize(h))

    def allgather_async(self, tensors: list[Tensor], name: str) -> Handle:
        base = name
        sizes = torch.tensor([t.shape[0] for t in tensors], dtype=torch.int32)
        h_sizes = self.hvd.allgather_async(sizes, name=f"{base}.sizes")
        handles = [self.hvd.allgather_async(t, name=f"{base}.{i}") for i, t in enumerate(tensors)]

        def finish() -> list[list[Tensor]]:
            per_rank = self.hvd.synchronize(h_sizes).view(self.size, len(tensors)).tolist()
            parts = [self.hvd.synchronize(h).split([row[i] for row in per_rank])
                     for i, h in enumerate(handles)]
            return [[parts[i][r] for i in range(len(tensors))] for r in range(self.size)]

        return Handle(finish)

    def alltoall(self, t: Tensor, splits: list[int], name: str) -> tuple[Tensor, list[int]]:
        out, received = self.hvd.alltoall(t, splits=torch.tensor(splits, dtype=torch.int32), name=name)
        return out, received.tolist()

    def broadcast_(self, t: Tensor, root: int = 0, name: str = "bcast") -> Tensor:
        return self.hvd.broadcast_(t, root_rank=root, name=name)

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        return self.hvd.broadcast_object(obj, root_rank=root, name="bcast_obj")

    def barrier(self) -> None:
        self.hvd.barrier()

    def shutdown(self) -> None:
        self.hvd.shutdown()
