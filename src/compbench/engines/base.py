"""The engine seam: the few collectives compbench needs, on Horovod or torch.distributed.

All collectives are issued in the same order on every rank (a hang otherwise). `*_async` calls
return a `Handle` at once; `handle.wait()` gives the result. Allgather takes a list of tensors whose
first dimension may differ between ranks and returns, per rank, the list that rank sent.
`allgather_payload_async` is comm=allgather's exchange: one collective per payload, sizes inside it
(engines.wire frames), and the bytes really sent returned with the payloads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from compbench.engines import wire


class Handle:
    """An operation in flight; `wait()` finishes it once and caches the result."""

    __slots__ = ("_finish", "_result", "_done")

    def __init__(self, finish: Callable[[], Any]) -> None:
        self._finish: Callable[[], Any] | None = finish
        self._done = False
        self._result: Any = None

    @classmethod
    def done(cls, result: Any) -> Handle:
        """A handle of work that already finished (blocking communicators)."""
        handle = cls(lambda: result)
        handle.wait()
        return handle

    def wait(self) -> Any:
        if not self._done:
            assert self._finish is not None  # dropped only once done
            self._result = self._finish()
            self._done = True
            self._finish = None  # drop references to buffers
        return self._result


@runtime_checkable
class Engine(Protocol):
    name: str
    rank: int
    size: int
    local_rank: int  # rank within this machine (node); a node's ranks are local_size consecutive ranks
    local_size: int
    device: torch.device  # this rank's (compbench.engines.device): where its training tensors live
    backend: str  # what carries its collectives: gloo, nccl, cpu:gloo,cuda:nccl (results.json)

    def allreduce_async(self, t: Tensor, name: str, average: bool = True) -> Handle: ...
    def allreduce_inplace_async(self: Engine, t: Tensor, name: str) -> Handle: ...
    def allgather_async(self, tensors: list[Tensor], name: str) -> Handle: ...
    def allreduce(self, t: Tensor, name: str, average: bool = True) -> Tensor: ...
    def allgather(self, tensors: list[Tensor], name: str) -> list[list[Tensor]]: ...
    def allgather_payload_async(self, payload: list[Tensor], name: str, bound: int | None) -> Handle: ...
    def allgather_uneven_async(self, payload: list[Tensor], name: str) -> Handle: ...
    def alltoall(self, t: Tensor, splits: list[int], name: str,
                 received: list[int] | None = None) -> tuple[Tensor, list[int]]:
        """Send t's first-dimension pieces `splits` to the ranks in order; returns what every rank
        sent this one and its sizes. `received`: those sizes, where the caller knows them (an engine
        may then skip exchanging them)."""
        ...
    def broadcast_(self, t: Tensor, root: int = 0, name: str = "bcast") -> Tensor: ...
    def broadcast_object(self, obj: Any, root: int = 0) -> Any: ...
    def shift(self, payload: list[Tensor], dst: int, src: int, name: str) -> list[Tensor]: ...
    def allreduce_group(self, t: Tensor, name: str, groups: list[list[int]]) -> Tensor:
        """The average of `t` over the ranks of this rank's group; `groups` partitions the ranks
        and is the same list, in the same order, on every rank (every rank calls it together)."""
        ...
    def barrier(self) -> None: ...
    def shutdown(self) -> None: ...


class EngineBase:
    """Blocking conveniences shared by both engines: a mixin of an `Engine` (its methods take `self`
    as one, so they type-check against the collectives the engine itself provides)."""

    def allreduce(self: Engine, t: Tensor, name: str, average: bool = True) -> Tensor:
        return self.allreduce_async(t, name, average).wait()

    def allreduce_inplace_async(self: Engine, t: Tensor, name: str) -> Handle:
        """Average `t` over the ranks into `t` itself (the dense gradient path: no clone, no copy
        back); the handle returns `t`. Engines override it with a truly in-place collective."""
        averaged = self.allreduce_async(t, name)
        return Handle(lambda: t.copy_(averaged.wait()))

    def allgather(self: Engine, tensors: list[Tensor], name: str) -> list[list[Tensor]]:
        return self.allgather_async(tensors, name).wait()

    def allgather_payload_async(self: Engine, payload: list[Tensor], name: str, bound: int | None) -> Handle:
        """One compressed exchange of comm=allgather as ONE collective. `bound`: None when every
        rank's payload has this rank's layout (the compressor declares exact `wire_bytes`), else the
        most bytes any rank's payload can take (`max_wire_bytes`), the same on every rank.
        `handle.wait()` -> (every rank's payload, the bytes this rank really put on the wire).
        This default (engines without a framed path) is the uneven allgather, booking the payload."""
        gathered = self.allgather_async(payload, name)
        sent = sum(t.numel() * t.element_size() for t in payload)
        return Handle(lambda: (gathered.wait(), sent))

    def allgather_uneven_async(self: Engine, payload: list[Tensor], name: str) -> Handle:
        """Every rank's payload (same tensors and dtypes, first dimensions that differ by rank and
        no bound worth padding to) as one framed collective; an engine whose allgather needs equal
        sizes exchanges the frames' lengths first and pads to the longest. `handle.wait()` ->
        (every rank's payload, the bytes this rank put on the wire, padding included). This
        default (engines that gather uneven frames) books the payload."""
        gathered = self.allgather_async(payload, name)
        sent = sum(t.numel() * t.element_size() for t in payload)
        return Handle(lambda: (gathered.wait(), sent))

    def allreduce_group(self: Engine, t: Tensor, name: str, groups: list[list[int]]) -> Tensor:
        """Engines without subgroup collectives: every rank's `t` gathered, this rank's group's
        averaged (right, but each rank receives every rank's tensor). The real engines override it
        with a collective of the group only."""
        group = own_group(groups, self.rank, self.size)
        gathered = self.allgather([t.reshape(-1)], name)
        return torch.stack([gathered[r][0] for r in group]).mean(0).view(t.shape)

    def shift(self: Engine, payload: list[Tensor], dst: int, src: int, name: str) -> list[Tensor]:
        """Send `payload` to rank `dst` and receive rank `src`'s; every rank calls it together (a
        ring hop). Two all-to-alls in which only `dst` gets data: a header, then the bytes.
        Engines with point-to-point sends override it."""
        size = self.size
        only = [0] * size
        only[dst] = wire.HEADER_LEN
        head, _ = self.alltoall(wire.header(payload), only, f"{name}.head")
        specs = wire.parse_header(head)
        blob = wire.to_bytes(payload)
        only[dst] = blob.numel()
        received, _ = self.alltoall(blob, only, f"{name}.blob")
        assert received.numel() == wire.nbytes(specs), (src, received.numel())
        return wire.from_bytes(received, specs)


def own_group(groups: list[list[int]], rank: int, size: int) -> list[int]:
    """This rank's group of the partition `groups` (checked: every rank exactly once)."""
    if sorted(r for g in groups for r in g) != list(range(size)):
        raise ValueError(f"groups {groups} do not partition the {size} ranks")
    return next(g for g in groups if rank in g)


def flat_average(engine: Engine, name: str, tensors: list[Tensor]) -> Handle:
    """Average `tensors` over the ranks as one flat buffer per dtype, each averaged in place by one
    collective (a copy in, views out): several tensors for the price of one message.
    `handle.wait()` is the list of averaged tensors, in the order given, each of its tensor's shape."""
    dtypes = list(dict.fromkeys(t.dtype for t in tensors))
    flats = [torch.cat([t.reshape(-1) for t in tensors if t.dtype == d]) for d in dtypes]
    handles = [engine.allreduce_inplace_async(flat, f"{name}.{i}") for i, flat in enumerate(flats)]

    def finish() -> list[Tensor]:
        averaged = dict(zip(dtypes, (h.wait() for h in handles), strict=True))
        pos = dict.fromkeys(dtypes, 0)
        out = []
        for t in tensors:
            start = pos[t.dtype]
            out.append(averaged[t.dtype][start : start + t.numel()].view(t.shape))
            pos[t.dtype] = start + t.numel()
        return out

    return Handle(finish)
