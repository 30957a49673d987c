"""`comm=hierarchical`: dense inside a node, compressed between nodes (DGC's fix for allgather's
growth with the number of nodes).

Per tensor: 1. every rank of a node sends its gradient to the node's leader (its local rank 0), in
fp32 or fp16 (`intra_dtype`), and the leader averages them; 2. the leaders compensate and compress
the node's average (error feedback lives on the leaders) and exchange payloads: an allgather in
which the other ranks send nothing, so one payload per node crosses the network instead of one
per worker; 3. each leader decodes the node payloads, averages them and sends the result to the
ranks of its node (in the gradient's dtype: every rank applies the same update).
With one node the exchange between nodes is empty: the result is the exact local average.

Topology from the launcher: LOCAL_RANK / LOCAL_WORLD_SIZE (torchrun, compbench's launcher) or
Horovod's local rank and size; a node's ranks are consecutive (torchrun and horovodrun -H assign
them so; checked once at start-up). Bytes booked: the compressed payloads a leader sends between
nodes (the intra-node traffic stays on the machine).
"""

from __future__ import annotations

import warnings
from typing import ClassVar

import torch
from torch import Tensor

from compbench.codec.base import Compressor, payload_nbytes
from compbench.comm.base import BlockingComm, CommTraits, encode
from compbench.engines import wire
from compbench.engines.base import Engine
from compbench.memory.base import Memory
from compbench.records.stats import StepStats

INTRA_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def node_leaders(engine: Engine) -> list[int]:
    """The leader (first rank) of every node, after checking that every node's ranks are
    consecutive and agree on their node's size."""
    mine = torch.tensor([[engine.rank - engine.local_rank, engine.local_size]], dtype=torch.int64,
                        device="cpu")  # the topology: host-side
    rows = [r[0].view(-1).tolist() for r in engine.allgather([mine], "hierarchical.topology")]
    for rank, (leader, size) in enumerate(rows):
        members = range(leader, leader + size)
        consistent = members.stop <= len(rows) and all(rows[r] == [leader, size] for r in members)
        if rank not in members or not consistent:
            raise ValueError("comm=hierarchical needs each node's ranks to be consecutive with one local "
                             f"size (rank {rank} reports node start {leader}, local size {size}); start the "
                             "job with torchrun or horovodrun -H host:slots, or use comm=allgather")
    return sorted({leader for leader, _ in rows})


class HierarchicalComm(BlockingComm):
    traits: ClassVar[CommTraits] = CommTraits(blocking=True, between_machines=True, pattern="hierarchical")

    def __init__(self, engine: Engine, compressor: Compressor, stats: StepStats,
                 intra_dtype: str = "fp32") -> None:
        super().__init__(engine, compressor, stats)
        self.check_options(intra_dtype=intra_dtype)
        self.intra_dtype = INTRA_DTYPES[intra_dtype]
        self.leaders = node_leaders(engine)
        self.leader = engine.rank - engine.local_rank
        self.members = range(self.leader, self.leader + engine.local_size)
        self.is_leader = engine.rank == self.leader
        if len(self.leaders) == 1 and engine.rank == 0 and compressor.name != "none":
            warnings.warn(f"comm=hierarchical on one node: compressor={compressor.name} is not used "
                          f"(nothing crosses between machines)", stacklevel=2)

    @staticmethod
    def check_options(intra_dtype: str = "fp32", **_: object) -> None:
        if intra_dtype not in INTRA_DTYPES:
            raise ValueError(f"comm.intra_dtype={intra_dtype} must be one of {', '.join(INTRA_DTYPES)}")

    def exchange(self, x: Tensor, name: str, memory: Memory) -> tuple[Tensor, int]:
        node_mean = self._node_average(x.reshape(-1), name)
        sent = 0
        averaged = node_mean
        if len(self.leaders) > 1:
            averaged, sent = self._between_nodes(node_mean, x, name, memory)
        return self._within_node(averaged, x, name).view(x.shape), sent

    def _to_leader(self, count: int) -> list[int]:
        splits = [0] * self.engine.size
        splits[self.leader] = count
        return splits

    def _node_average(self, flat: Tensor, name: str) -> Tensor:
        if len(self.members) == 1:
            return flat
        splits = self._to_leader(flat.numel())
        got, _ = self.engine.alltoall(flat.to(self.intra_dtype), splits, f"{name}.hier.in")
        if not self.is_leader:
            return flat  # not used: the leader's result comes back in _within_node
        return got.view(len(self.members), -1).to(flat.dtype).sum(0).div_(len(self.members))

    def _between_nodes(self, node_mean: Tensor, x: Tensor, name: str, memory: Memory) -> tuple[Tensor, int]:
        # One packed uint8 tensor per leader (header and payload bytes); the others send none.
        packed, sent = torch.zeros(0, dtype=torch.uint8, device=x.device), 0
        if self.is_leader:
            payload, ctx = encode(self.compressor, memory, node_mean.view(x.shape), name, self.stats)
            packed, sent = wire.pack(payload, x.device), payload_nbytes(payload)
        gathered = self.engine.allgather([packed], f"{name}.hier.x")
        if not self.is_leader:
            return node_mean, 0
        # every leader's header in one host read: the sizes cut the payloads (uneven by rank)
        payloads = wire.unpack_all([gathered[r][0] for r in self.leaders])
        with self.stats.time("decompress"):
            return self.compressor.decompress_all(payloads, ctx).reshape(-1), sent

    def _within_node(self, averaged: Tensor, x: Tensor, name: str) -> Tensor:
        if len(self.members) == 1:
            return averaged
        splits = [0] * self.engine.size
        if self.is_leader:
            for r in self.members[1:]:
                splits[r] = averaged.numel()
        data = averaged.repeat(len(self.members) - 1) if self.is_leader else x.new_zeros(0)
        got, _ = self.engine.alltoall(data.contiguous(), splits, f"{name}.hier.out")
        return averaged if self.is_leader else got
