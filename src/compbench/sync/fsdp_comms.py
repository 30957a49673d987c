"""FSDP2's two collectives, compbench's: the weight all-gather and the gradient reduce-scatter of every
FSDP unit, dense or through a block quantizer (compbench.codec.blockquant), timed into the step's split
and booked per direction.

All-gather: each worker encodes its flat shard once (`gather`: fp16/bf16 casts, qwZ's int8 blocks,
FP8 e4m3 with per-block or per-tensor scales, QSDP's stochastic rounding), the encodings are
all-gathered as bytes (every worker's the same length) and decoded into FSDP's output buffer.
Reduce-scatter: dense, one `reduce_scatter_tensor`; quantized (qgZ), each worker encodes the chunk
meant for each peer, one all-to-all moves them, and each worker decodes and sums what it received
for its own shard in fp32 (LoCo: the chunks are (gradient + compressed error), the error kept in 8-bit
blocks per unit). A unit's input has the same size every step, so a unit keeps its error state.

Bytes are booked as ZeRO++ counts volume: an all-gather moves the unit's whole gathered buffer, a
reduce-scatter its whole input (a ring moves (w-1)/w of it through each worker); `cross_node` is the
part whose group spans nodes (a node is `local_size` consecutive ranks). Dense fp32 is the reference
the effective ratio compares against.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from compbench.codec.blockquant import BlockFormat, ErrorCompensated, decode, encode
from compbench.records.stats import StepStats
from compbench.sync.sharding import Format


class DirectionLedger:
    """A step's bytes (and dense fp32 bytes) and milliseconds per direction; `cross_node` the bytes
    of collectives whose group spans nodes."""

    def __init__(self, stats: StepStats, local_size: int) -> None:
        self.stats, self.local_size = stats, local_size
        self._spans_nodes: dict[dist.ProcessGroup, bool] = {}
        self.begin_step()

    def begin_step(self) -> None:
        self.bytes: dict[str, int] = defaultdict(int)
        self.dense: dict[str, int] = defaultdict(int)
        self.spans: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
        self.cross_node = 0

    def book(self, direction: str, nbytes: int, dense: int, group: dist.ProcessGroup) -> None:
        self.bytes[direction] += nbytes
        self.dense[direction] += dense
        self.stats.bytes_sent += nbytes
        self.stats.bytes_dense += dense
        if self._crosses_nodes(group):
            self.cross_node += nbytes

    def _crosses_nodes(self, group: dist.ProcessGroup) -> bool:
        """Whether `group` spans nodes (asked once per group: every unit's collectives ask it)."""
        if group not in self._spans_nodes:
            ranks = dist.get_process_group_ranks(group)
            self._spans_nodes[group] = len({r // self.local_size for r in ranks}) > 1
        return self._spans_nodes[group]

    @contextmanager
    def span(self, direction: str) -> Iterator[None]:
        clock = self.stats.clock
        start = clock.mark()
        try:
            yield
        finally:
            self.spans[direction].append((start, clock.mark()))

    def ms(self, direction: str) -> float:
        """Milliseconds in this direction's collectives this step (read after the step ended)."""
        clock = self.stats.clock
        return sum(clock.elapsed_ms(a, b) for a, b in self.spans[direction])


class _Comm:
    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                 device: torch.device) -> Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class CompbenchAllGather(_Comm, AllGather):
    """One unit's weight all-gather (see the module)."""

    def __init__(self, fmt: BlockFormat | torch.dtype | None, ledger: DirectionLedger,
                 generator: torch.Generator | None) -> None:
        self.fmt, self.ledger, self.generator = fmt, ledger, generator

    def __call__(self, output_tensor: Tensor, input_tensor: Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> dist.Work | None:
        stats, world, n = self.ledger.stats, group.size(), input_tensor.numel()
        dense = n * world * input_tensor.element_size()
        with self.ledger.span("gathered"):
            if self.fmt is None:
                with stats.time("comm", exposed=True):
                    dist.all_gather_into_tensor(output_tensor, input_tensor, group=group)
                self.ledger.book("gathered", dense, dense, group)
                return None
            with stats.time("compress"):
                if isinstance(self.fmt, torch.dtype):
                    wire = input_tensor.to(self.fmt).view(torch.uint8)
                else:
                    wire = encode(input_tensor, self.fmt, self.generator)
            out = torch.empty(world * wire.numel(), dtype=torch.uint8, device=wire.device)
            with stats.time("comm", exposed=True):
                dist.all_gather_into_tensor(out, wire, group=group)
            with stats.time("decompress"):
                for r, part in enumerate(out.chunk(world)):
                    _decode_into(part, output_tensor[r * n:(r + 1) * n], self.fmt)
            self.ledger.book("gathered", out.numel(), dense, group)
        return None


class CompbenchReduceScatter(_Comm, ReduceScatter):
    """One unit's gradient reduce-scatter (see the module)."""

    def __init__(self, fmt: BlockFormat | torch.dtype | None, ledger: DirectionLedger,
                 compensated: Callable[[], ErrorCompensated] | None) -> None:
        self.fmt, self.ledger = fmt, ledger
        self.make_compensated = compensated
        self.compensated: list[ErrorCompensated] = []  # LoCo: one error per peer's chunk

    def __call__(self, output_tensor: Tensor, input_tensor: Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> dist.Work | None:
        stats, world = self.ledger.stats, group.size()
        average = _averages(op)
        dense = input_tensor.numel() * input_tensor.element_size()
        with self.ledger.span("scattered"):
            if self.fmt is None:
                with stats.time("comm", exposed=True):
                    dist.reduce_scatter_tensor(output_tensor, input_tensor, op=dist.ReduceOp.SUM, group=group)
                if average:
                    output_tensor.div_(world)
                self.ledger.book("scattered", dense, dense, group)
                return None
            chunks = input_tensor.view(world, -1)
            with stats.time("compress"):
                wire = self._encode(chunks)
            received = torch.empty_like(wire)
            with stats.time("comm", exposed=True):
                dist.all_to_all_single(received, wire, group=group)
            with stats.time("decompress"):
                total = torch.zeros(chunks.shape[1], dtype=torch.float32, device=output_tensor.device)
                part = torch.empty_like(total)
                for piece in received.chunk(world):
                    _decode_into(piece, part, self.fmt)
                    total += part
                output_tensor.copy_(total.div_(world) if average else total)
            self.ledger.book("scattered", wire.numel(), dense, group)
        return None

    def _encode(self, chunks: Tensor) -> Tensor:
        """Each peer's chunk encoded on its own, concatenated in rank order (equal lengths)."""
        if isinstance(self.fmt, torch.dtype):
            return chunks.to(self.fmt).reshape(-1).view(torch.uint8)
        assert self.fmt is not None
        if self.make_compensated is None:
            return torch.cat([encode(c, self.fmt) for c in chunks])
        if not self.compensated:
            self.compensated = [self.make_compensated() for _ in range(chunks.shape[0])]
        return torch.cat([ec.encode(c) for ec, c in zip(self.compensated, chunks, strict=True)])

    def state_dict(self) -> dict[str, Any]:
        return {"compensated": [ec.state_dict() for ec in self.compensated]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("compensated", [])
        if saved and self.make_compensated is not None:
            self.compensated = [self.make_compensated() for _ in saved]
            for ec, s in zip(self.compensated, saved, strict=True):
                ec.load_state_dict(s)


def _averages(op: Any) -> bool:
    if op in (dist.ReduceOp.AVG, dist.ReduceOp.SUM):
        return op == dist.ReduceOp.AVG
    raise ValueError(f"FSDP asked for a reduce-scatter with {op}; compbench's sums or averages")


def _decode_into(wire: Tensor, out: Tensor, fmt: BlockFormat | torch.dtype) -> None:
    if isinstance(fmt, torch.dtype):
        out.copy_(wire.view(fmt))
    else:
        decode(wire, out.numel(), fmt, out=out)


def install_comms(units: list[FSDPModule], gather: Format, scatter: Format, compensate: bool,
                  ledger: DirectionLedger, device: torch.device) -> list[CompbenchReduceScatter]:
    """compbench's all-gather and reduce-scatter on every FSDP unit (one object per unit: LoCo's
    error is a unit's); returns the reduce-scatters (their state is the run's). Stochastic rounding
    draws from one generator seeded alike on every rank, on the device."""
    generator = None
    if isinstance(gather, BlockFormat) and gather.stochastic:
        generator = torch.Generator(device=device)
        generator.manual_seed(0x5D9)
    compensated = None
    if compensate:
        assert isinstance(scatter, BlockFormat)
        fmt = scatter

        def compensated() -> ErrorCompensated:
            return ErrorCompensated(fmt)

    scatters = []
    for unit in units:
        unit.set_custom_all_gather(CompbenchAllGather(gather, ledger, generator))
        scatters.append(CompbenchReduceScatter(scatter, ledger, compensated))
        unit.set_custom_reduce_scatter(scatters[-1])
    return scatters
