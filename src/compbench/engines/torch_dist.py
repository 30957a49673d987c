"""`engine=torch`: torch.distributed: gloo on the CPU; on GPUs NCCL for the CUDA tensors (gloo for the
host-side ones), or gloo's CUDA collectives where workers share a GPU (compbench.engines.device)."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor

from compbench.base.values import KeyRange
from compbench.engines import wire
from compbench.engines.base import EngineBase, Handle, own_group
from compbench.engines.device import Placement, host_to, torch_backend

_TAG_HEADER, _TAG_BLOB = 11, 12
# DDP's default bucket (bucket_cap_mb=25): the largest piece one dense allreduce sends.
DENSE_CHUNK_BYTES = 25 * 1024 * 1024


class TorchEngine(EngineBase):
    """Joins the process group described by the environment (torchrun or compbench's launcher).

    compbench's launcher passes a file:// rendezvous in COMPBENCH_INIT_METHOD (no ports to collide);
    torchrun's MASTER_ADDR/MASTER_PORT are used otherwise (`env://`).

    `elastic`: the job runs under TorchElastic (torchrun --nnodes=MIN:MAX, compbench.train.elastic_torch):
    a failed or joining worker restarts every worker in a new world, which continues from its commits;
    `min_np`: the fewest workers it continues with (below, it stops with a checkpoint).

    `placement` (compbench.engines.device) puts this rank on its device and picks the backend `auto` means
    (`device.torch_backend`): gloo on the CPU; on GPUs one process group with NCCL for CUDA tensors
    and gloo for host tensors, so that every collective goes where its tensor lives; gloo alone
    where workers share a GPU, whose CUDA collectives stage through host memory and which has no
    point-to-point for CUDA tensors (`shift` then takes the all-to-all of `EngineBase.shift`).
    """

    name = "torch"
    # The process group every collective runs in: the world (None), or one group of a partition
    # (`within`: a sharded run's shard groups, and its replica groups, whose ranks hold the same shard).
    group: Any = None
    KEY_RANGES: ClassVar[dict[str, KeyRange]] = {
        "min_np": KeyRange(1, what="the fewest workers an elastic run continues with")}

    def __init__(self, backend: str = "auto", timeout_s: float = 300.0, elastic: bool = False,
                 min_np: int = 1, placement: Placement | None = None) -> None:
        self.elastic, self.min_np = elastic, min_np
        placement = placement or Placement("cpu", 0, 1, "device=cpu")
        self.device = placement.device(int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # NCCL's communicators and the kernels' current device
        self.backend = torch_backend(backend, self.device, placement.shares_gpu)
        if not dist.is_initialized():
            dist.init_process_group(
                self.backend,
                init_method=os.environ.get("COMPBENCH_INIT_METHOD", "env://"),
                rank=int(os.environ["RANK"]),
                world_size=int(os.environ["WORLD_SIZE"]),
                timeout=timedelta(seconds=timeout_s),
            )
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        self.local_size = int(os.environ.get("LOCAL_WORLD_SIZE", self.size))
        self._capacity: dict[str, int] = {}  # allgather_payload_async: frame bytes per name
        self._groups: dict[tuple[int, ...], Any] = {}  # `_process_group`: process groups by ranks

    def within(self, groups: list[list[int]]) -> TorchEngine:
        """This engine's collectives restricted to this rank's group of the partition `groups`:
        rank and size are the group's, ranks named in calls (broadcast roots, ring peers) too.
        `new_group` is collective over the world: every rank calls this with the same partition."""
        import copy

        mine = own_group(groups, self.rank, self.size)
        scoped = copy.copy(self)
        scoped.group = self._process_group(groups)
        scoped.rank, scoped.size = sorted(mine).index(self.rank), len(mine)
        scoped.local_rank, scoped.local_size = scoped.rank, scoped.size
        scoped._capacity, scoped._groups = {}, {}
        return scoped

    def allreduce_async(self, t: Tensor, name: str, average: bool = True) -> Handle:
        out = t.clone()  # like Horovod: the caller's tensor is left alone
        work = dist.all_reduce(out, group=self.group, async_op=True)

        def finish() -> Tensor:
            work.wait()
            return out.div_(self.size) if average else out

        return Handle(finish)

    def allreduce_inplace_async(self, t: Tensor, name: str) -> Handle:
        # Gloo has no AVG: sum in place, then one in-place division (no clone, no copy back). A large
        # tensor goes as chunks of DDP's bucket size, each its own collective, as DDP's buckets do:
        # Gloo runs queued collectives on its worker threads at once, so the reductions of the chunks
        # share the cores instead of one thread reducing 67 MB alone.
        pieces = [t]
        if t.is_contiguous() and t.device.type == "cpu":
            pieces = list(t.view(-1).split(max(1, DENSE_CHUNK_BYTES // t.element_size())))
        works = [dist.all_reduce(piece, group=self.group, async_op=True) for piece in pieces]

        def finish() -> Tensor:
            for work in works:
                work.wait()
            return t.div_(self.size)

        return Handle(finish)

    def allgather_async(self, tensors: list[Tensor], name: str) -> Handle:
        # all_gather needs equal shapes: exchange first dimensions, pad to the largest, trim after.
        sizes = torch.tensor([t.shape[0] for t in tensors], dtype=torch.int64)
        all_sizes = [torch.empty_like(sizes) for _ in range(self.size)]
        dist.all_gather(all_sizes, sizes, group=self.group)
        per_rank = [s.tolist() for s in all_sizes]
        pending = []
        for i, t in enumerate(tensors):
            longest = max(row[i] for row in per_rank)
            padded = t
            if t.shape[0] < longest:
                padded = torch.cat([t, t.new_zeros((longest - t.shape[0], *t.shape[1:]))])
            bufs = [torch.empty_like(padded) for _ in range(self.size)]
            work = dist.all_gather(bufs, padded.contiguous(), group=self.group, async_op=True)
            pending.append((work, bufs))

        def finish() -> list[list[Tensor]]:
            for work, _ in pending:
                work.wait()
            return [[pending[i][1][r][: per_rank[r][i]] for i in range(len(tensors))]
                    for r in range(self.size)]

        return Handle(finish)

    def allgather_payload_async(self, payload: list[Tensor], name: str, bound: int | None) -> Handle:
        """One all_gather per exchange. Gloo gathers equal sizes only: a payload of the same layout on
        every rank (`bound` None) goes as it is; an uneven one as a frame (engines.wire: a header of
        first dimensions, then the bytes) padded to a capacity every rank knows, so no sizes travel
        first. A name's first exchange pads to the compressor's bound; after that the capacity is the
        longest frame any rank sent last time plus 1/8 or 4 KiB, whichever is more (4 KiB is 33 us at
        1 Gbit/s, less than the round trip of a second collective, and the payloads of small tensors
        vary by more than 1/8), shrinking by at most 1/16 a call, never above the bound. A frame
        longer than the capacity sends the rest in a second all_gather (every rank sees the headers,
        so every rank knows). The padding is booked: it is on the wire. The host reads every rank's
        header once per exchange (`wire.read_headers`: one wait on a GPU, which the method needs:
        the lengths size the rest and the next capacity)."""
        if bound is None:
            return self._gather_equal(payload)
        longest = wire.frame_header_bytes(payload) + bound
        known = self._capacity.get(name)  # None: this name's first exchange, padded to the bound
        capacity = longest if known is None else min(known, longest)
        blob = wire.frame(payload, header=True)
        used = blob.numel()
        first = blob[:capacity] if used >= capacity else torch.cat([blob, blob.new_zeros(capacity - used)])
        out = first.new_empty(self.size * capacity)
        work = dist.all_gather(list(out.chunk(self.size)), first, group=self.group, async_op=True)

        def finish() -> tuple[list[list[Tensor]], int]:
            work.wait()
            rows = out.view(self.size, capacity)
            # the exchange's one host read (every rank's header): the lengths decide the second
            # all_gather and the next capacity, and cut the frames
            dims = wire.read_headers(rows, payload)
            lengths = [wire.frame_length(d, payload) for d in dims]
            over = max(lengths) - capacity
            sent = capacity
            if over > 0:  # the rest of the long frames, padded to the longest rest
                rest = blob[capacity:]
                rest = torch.cat([rest, rest.new_zeros(over - rest.numel())])
                tail = rest.new_empty(self.size * over)
                dist.all_gather(list(tail.chunk(self.size)), rest, group=self.group)
                rows = torch.cat([rows, tail.view(self.size, over)], dim=1)
                sent += over
            most = max(lengths)
            want = _round_up(most + max(most // 8, 4096), 64)
            self._capacity[name] = min(longest, want if known is None else max(want, capacity * 15 // 16))
            return [wire.unframe(rows[r], payload, True, dims[r])[0] for r in range(self.size)], sent

        return Handle(finish)

    def allgather_uneven_async(self, payload: list[Tensor], name: str) -> Handle:
        """The frames' lengths first (one small all_gather), then one all_gather padded to the
        longest; the padding and the length are booked: they are on the wire."""
        blob = wire.frame(payload, header=True)
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        dist.all_gather(lengths, torch.tensor([blob.numel()], dtype=torch.int64), group=self.group)
        longest = max(int(n) for n in lengths)
        padded = torch.cat([blob, blob.new_zeros(longest - blob.numel())]) if longest > blob.numel() else blob
        out = padded.new_empty(self.size * longest)
        work = dist.all_gather(list(out.chunk(self.size)), padded, group=self.group, async_op=True)

        def finish() -> tuple[list[list[Tensor]], int]:
            work.wait()
            rows = out.view(self.size, longest)
            dims = wire.read_headers(rows, payload)  # one host read of every rank's header
            return [wire.unframe(rows[r], payload, True, dims[r])[0] for r in range(self.size)], longest + 8

        return Handle(finish)

    def _gather_equal(self, payload: list[Tensor]) -> Handle:
        """Every rank's payload has this layout: one all_gather of it (as it is if one tensor)."""
        single = len(payload) == 1 and payload[0].dim() > 0
        blob = payload[0].contiguous() if single else wire.frame(payload, header=False)
        out = blob.new_empty((self.size * blob.shape[0], *blob.shape[1:]))
        rows = blob.shape[0]
        parts = [out[r * rows : (r + 1) * rows] for r in range(self.size)]
        work = dist.all_gather(parts, blob, group=self.group, async_op=True)

        def finish() -> tuple[list[list[Tensor]], int]:
            work.wait()
            per_rank = [[p] for p in parts] if single else [wire.unframe(p, payload, False)[0] for p in parts]
            return per_rank, blob.numel() * blob.element_size()

        return Handle(finish)

    def alltoall(self, t: Tensor, splits: list[int], name: str,
                 received: list[int] | None = None) -> tuple[Tensor, list[int]]:
        if received is None:  # the sizes first, unless the caller knows them
            send = torch.tensor(splits, dtype=torch.int64)
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv, send, group=self.group)
            received = recv.tolist()
        out = t.new_empty((sum(received), *t.shape[1:]))
        dist.all_to_all_single(out, t.contiguous(), output_split_sizes=received, input_split_sizes=splits,
                               group=self.group)
        return out, received

    def broadcast_(self, t: Tensor, root: int = 0, name: str = "bcast") -> Tensor:
        dist.broadcast(t, group=self.group, group_src=root)
        return t

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, group=self.group, group_src=root)
        return box[0]

    def shift(self, payload: list[Tensor], dst: int, src: int, name: str) -> list[Tensor]:
        """A ring hop with point-to-point sends: a fixed-length header, then the bytes. gloo sends
        host tensors only: CUDA payloads over gloo take the all-to-all of `EngineBase.shift`.

        Each round's send and receive go out as one batch (`batch_isend_irecv`: one NCCL group), so
        they are paired: NCCL queues a rank's point-to-point operations on one stream, and a blob
        sent before the peer's blob is received waits there for a receive queued behind the peer's
        own send, a deadlock with 2 ranks once a payload exceeds NCCL's buffer. gloo runs the same
        batch as plain isend/irecv."""
        device = payload[0].device if payload else torch.device("cpu")
        if device.type == "cuda" and self.backend == "gloo":
            return super().shift(payload, dst, src, name)

        def _paired(ops: list[dist.P2POp]) -> None:
            if ops:
                for work in dist.batch_isend_irecv(ops):
                    work.wait()

        head_out = host_to(wire.header(payload), device)  # pinned, queued: no wait for the upload
        blob_out = wire.to_bytes(payload, device)
        head_in = torch.empty_like(head_out)
        _paired([dist.P2POp(dist.isend, head_out, group=self.group, group_peer=dst, tag=_TAG_HEADER),
                 dist.P2POp(dist.irecv, head_in, group=self.group, group_peer=src, tag=_TAG_HEADER)])
        specs = wire.parse_header(head_in.cpu())  # the blob's size: the hop's one host read
        blob_in = torch.empty(wire.nbytes(specs), dtype=torch.uint8, device=device)
        # A side with nothing to move leaves its op out; the peer's header says so on both sides.
        _paired([*([dist.P2POp(dist.isend, blob_out, group=self.group, group_peer=dst,
                                             tag=_TAG_BLOB)] if blob_out.numel() else []),
                 *([dist.P2POp(dist.irecv, blob_in, group=self.group, group_peer=src,
                                             tag=_TAG_BLOB)] if blob_in.numel() else [])])
        return wire.from_bytes(blob_in, specs)

    def allreduce_group(self, t: Tensor, name: str, groups: list[list[int]]) -> Tensor:
        """One all_reduce inside this rank's process group (`_process_group`); the whole world is the
        default group."""
        if self.group is not None:
            raise ValueError("a scoped engine (TorchEngine.within) has no further groups")
        group = own_group(groups, self.rank, self.size)
        if len(group) == 1:
            return t.clone()
        handle = self._process_group(groups) if len(group) < self.size else None
        out = t.clone()
        dist.all_reduce(out, group=handle)
        return out.div_(len(group))

    def _process_group(self, groups: list[list[int]]) -> Any:
        """This rank's process group of the partition `groups`. `new_group` is collective over the
        whole world: every rank creates every group of the partition, in its order, the first time
        it appears (the partition is the same on every rank, so the calls match)."""
        for ranks in groups:
            key = tuple(sorted(ranks))
            if key not in self._groups:
                self._groups[key] = dist.new_group(list(key))
        return self._groups[tuple(sorted(own_group(groups, self.rank, self.size)))]

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def shutdown(self) -> None:
        if self.group is None and dist.is_initialized():  # a scoped engine's world ends with the world's
            # Tearing gloo down while a peer still talks to us aborts the process (std::terminate).
            dist.barrier()
            dist.destroy_process_group()


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
