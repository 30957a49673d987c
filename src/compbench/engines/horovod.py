"""`engine=horovod`: Horovod collectives (Gloo on CPU, NCCL on GPU), as the seeds use."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from compbench.base.values import KeyRange
from compbench.engines import wire
from compbench.engines.base import EngineBase, Handle, own_group
from compbench.engines.device import Placement


class HorovodEngine(EngineBase):
    """Joins the Horovod job described by the environment (horovodrun or compbench's launcher).

    `elastic`: the job runs under Horovod Elastic (compbench.train.elastic_horovod): the world may
    shrink and grow while it trains, and `refresh` reads the new one after each reset; `min_np`: the
    fewest workers it continues with (below, it stops with a checkpoint)."""

    name = "horovod"
    KEY_RANGES: ClassVar[dict[str, KeyRange]] = {
        "min_np": KeyRange(1, what="the fewest workers an elastic run continues with")}

    def __init__(self, elastic: bool = False, min_np: int = 1, placement: Placement | None = None) -> None:
        import horovod.torch as hvd

        self.hvd = hvd
        self.elastic, self.min_np = elastic, min_np
        hvd.init()
        self.refresh()
        # The device is this process's for its whole life: an elastic reset renumbers the ranks, and
        # a survivor's model and state stay where they are (compbench.engines.device; one GPU per worker).
        self.device = (placement or Placement("cpu", 0, 1, "device=cpu")).device(self.local_rank)
        self.backend = "gloo"
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # Horovod's NCCL reduces on the current device
            self.backend = "nccl" if hvd.nccl_built() else "gloo"

    def refresh(self) -> None:
        """Read this process's place in the (new) world: after `hvd.init`, and after each reset of an
        elastic job (ranks are numbered again; process sets of the old world are gone)."""
        hvd = self.hvd
        self.rank, self.size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
        self.local_size = hvd.local_size()
        self._sets: dict[tuple[int, ...], Any] = {}  # allreduce_group: process sets by ranks

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
        # Horovod gathers tensors whose first dimensions differ in one call but does not say where
        # one rank's part ends: the sizes travel in the frame's header, not in a collective of their own.
        return self._gather_frames(tensors, name, header=True, result=lambda per_rank, sent: per_rank)

    def allgather_payload_async(self, payload: list[Tensor], name: str, bound: int | None) -> Handle:
        # Horovod's allgather takes uneven frames as they are: no capacity, nothing padded.
        return self._gather_frames(payload, name, header=bound is not None,
                                   result=lambda per_rank, sent: (per_rank, sent))

    def allgather_uneven_async(self, payload: list[Tensor], name: str) -> Handle:
        return self._gather_frames(payload, name, header=True, result=lambda per_rank, sent: (per_rank, sent))

    def _gather_frames(self, tensors: list[Tensor], name: str, header: bool, result) -> Handle:
        """One Horovod allgather of each rank's frame (engines.wire), split back into payloads."""
        single = not header and len(tensors) == 1 and tensors[0].dim() > 0
        blob = tensors[0] if single else wire.frame(tensors, header)
        h = self.hvd.allgather_async(blob, name=name)
        sent = blob.numel() * blob.element_size()

        def finish():
            out = self.hvd.synchronize(h)
            if single:
                return result([[part] for part in out.split(tensors[0].shape[0])], sent)
            per_rank, pos = [], 0
            for _ in range(self.size):
                payload, length = wire.unframe(out[pos:], tensors, header)
                per_rank.append(payload)
                pos += length
            assert pos == out.numel(), (pos, out.numel())
            return result(per_rank, sent)

        return Handle(finish)

    def alltoall(self, t: Tensor, splits: list[int], name: str,
                 received: list[int] | None = None) -> tuple[Tensor, list[int]]:
        # Horovod's all-to-all negotiates the sizes itself: `received` (known sizes) saves nothing
        out, sizes = self.hvd.alltoall(t, splits=torch.tensor(splits, dtype=torch.int32), name=name)
        return out, sizes.tolist()

    def broadcast_(self, t: Tensor, root: int = 0, name: str = "bcast") -> Tensor:
        return self.hvd.broadcast_(t, root_rank=root, name=name)

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        return self.hvd.broadcast_object(obj, root_rank=root, name="bcast_obj")

    def allreduce_group(self, t: Tensor, name: str, groups: list[list[int]]) -> Tensor:
        """One allreduce inside this rank's Horovod process set. A group smaller than the world
        needs process sets added after `hvd.init`: Horovod allows it only with
        HOROVOD_DYNAMIC_PROCESS_SETS=1 in the job's environment (compbench does not turn it on for
        every run); `add_process_set` is collective, so every rank adds every group of the
        partition, in its order, the first time it appears. The whole world is the global set."""
        group = own_group(groups, self.rank, self.size)
        if len(group) == 1:
            return t.clone()
        if len(group) == self.size:
            return self.hvd.allreduce(t, name=name, op=self.hvd.Average)
        for ranks in groups:
            key = tuple(sorted(ranks))
            if key not in self._sets:
                try:
                    self._sets[key] = self.hvd.add_process_set(list(key))
                except ValueError as e:
                    raise RuntimeError("averaging within a group of workers on engine=horovod needs "
                                       "HOROVOD_DYNAMIC_PROCESS_SETS=1 in the environment") from e
        return self.hvd.allreduce(t, name=name, op=self.hvd.Average,
                                  process_set=self._sets[tuple(sorted(group))])

    def barrier(self) -> None:
        self.hvd.barrier()

    def shutdown(self) -> None:
        self.hvd.shutdown()
