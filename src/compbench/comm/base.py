"""The communicator seam: traits as data, the protocol, and the one encode step they all share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeGuard, runtime_checkable

from torch import Tensor

from compbench.codec.base import (
    PROMISES,
    Capabilities,
    Compressor,
    Ctx,
    FusesMemory,
    derive,
    fuses_memory,
    payload_nbytes,
)
from compbench.codec.deferred import Deferred
from compbench.engines.base import Engine, Handle
from compbench.memory.base import Memory
from compbench.records.stats import StepStats


@dataclass(frozen=True)
class CommTraits:
    """What a communicator accepts, declared once per class; the config check reads only this.
    `sparse_results` and `packs` promise members (`SparseResults`, `ReducesMany`): they are derived
    from the class as a compressor's are (`codec.base.derive`).

    engines: the engines it runs on.
    needs_summable: payloads are summed by an allreduce: only `Capabilities.summable` compressors,
      or `collective` ones (their own allreduce protocol).
    blocking: `reduce` finishes the whole exchange before it returns (decode and re-encode at every
      server or hop), so nothing overlaps back-propagation.
    reencodes_sums: decodes partial sums, adds and re-encodes them (a ring): only compressors whose
      ranks combine by the mean, without a collective protocol of their own.
    between_machines: compresses only what crosses between machines (hierarchical): on one machine,
      where compbench's own launcher puts every worker, the compressor is not used.
    pattern: the collectives one compressed exchange costs, for the what-if cluster model
      (compbench.comm.cost_model): "allgather" (every payload to every rank), "allreduce" (a ring
      allreduce of the payload), "ps" (all-to-all of shards, re-encoded shards gathered) or
      "hierarchical" (fp32 to the node's leader, leaders' allgather, back to the workers).
    sparse_results: hands the average back sparse (a coalesced COO tensor, no dense decode) for the
      names in `sparse_names`, which the pipeline sets, when the compressor declares
      `Capabilities.sparse_average` (comm=allgather).
    packs: `reduce_many` exchanges several tensors, each compressed on its own, in one collective
      per stage of the exchange (one allgather; ps: one all-to-all and one all-gather; allreduce:
      one allreduce per payload dtype) instead of one or more per tensor (`packs(...)` says when).
    elastic: its per-rank state can be taken into a world of another size (engine.elastic=true).
    """

    engines: tuple[str, ...] = ("horovod", "torch")
    needs_summable: bool = False
    blocking: bool = False
    reencodes_sums: bool = False
    between_machines: bool = False
    pattern: str = "allgather"
    sparse_results: bool = False
    packs: bool = False
    elastic: bool = True


@runtime_checkable
class Communicator(Protocol):
    traits: ClassVar[CommTraits]
    blocking: bool  # this instance's `reduce` finishes the exchange before returning

    def reduce(self, grad: Tensor, name: str, memory: Memory) -> Handle:
        """Start averaging `grad` over all ranks; `handle.wait()` is the averaged dense tensor
        (grad's shape). Every rank calls it with the same names in the same order. The caller hands
        `grad` over: the result may be written into it (comm=allgather decodes into it), so pass a
        copy of anything still needed. With `traits.sparse_results`, for a name in the instance's
        `sparse_names` and a compressor with `caps.sparse_average`, the result is the decoded sparse
        payload instead: a coalesced COO tensor of grad's shape (`decompress_all_sparse`), for an
        optimizer that steps from it in one pass (`optim.optimizers.SGD`)."""
        ...

    @staticmethod
    def check_options(**options: Any) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


@runtime_checkable
class SparseResults(Protocol):
    """A communicator with `traits.sparse_results`: the names whose average it hands back sparse."""

    sparse_names: frozenset[str]


@runtime_checkable
class ReducesMany(Protocol):
    """A communicator with `traits.packs`."""

    def reduce_many(self, name: str, items: list[tuple[str, Tensor]], memory: Memory) -> Handle:
        """`reduce` of every (name, grad) of `items` in one exchange named `name`: each tensor
        compensated and compressed on its own (its name keys the memory and the compressor's state,
        as `reduce` would), the payloads in one collective per stage. `handle.wait()` is the list of
        averaged tensors in the order of `items` (sparse for names in `sparse_names`, as `reduce`).
        Books one compressed exchange: what this rank put on the wire for all of them."""
        ...


@runtime_checkable
class PackingCommunicator(Communicator, ReducesMany, Protocol):
    """A communicator with `traits.packs`, as the pipeline holds it."""


PROMISES[CommTraits] = {"sparse_results": SparseResults, "packs": ReducesMany}


def sparse_results(comm: Communicator) -> TypeGuard[SparseResults]:
    """The flag is derived from the Protocol (`codec.base.derive`): a communicator with it has it."""
    return comm.traits.sparse_results


def packs(comm: CommTraits, caps: Capabilities) -> bool:
    """Whether `reduce_many` can take this compressor: a communicator that packs, unless the
    compressor runs its own collective protocol there (PowerSGD's two allreduces per tensor)."""
    return comm.packs and not (caps.collective and comm.needs_summable)


def encode(compressor: Compressor, memory: Memory, x: Tensor, name: str, stats: StepStats,
           partial: Tensor | None = None) -> tuple[list[Tensor], Ctx]:
    """The one memory -> compress -> update step: compensate `x` (plus a `partial` sum received
    from a peer, for a ring hop), compress it, let the memory keep what the compressor dropped.
    A compressor that fuses the memory (`Capabilities.fuses_memory`) runs the memory's deferred
    compensation inside its selection pass (`Memory.defer`): same payload, same memory state."""
    with stats.time("compress"):
        fusing: FusesMemory[Deferred] | None = (
            compressor if partial is None and fuses_memory(compressor) else None)
        deferred = memory.defer(x, name) if fusing is not None else None
        if fusing is not None and deferred is not None:
            payload, ctx = fusing.compress_deferred(deferred, name)
            y = deferred.result
            assert y is not None, f"{compressor.name}: compress_deferred must run the compensation"
        else:
            y = memory.compensate(x, name)
            if partial is not None:
                y = y + partial.reshape(y.shape)
            payload, ctx = compressor.compress(y, name)
        memory.update(y, name, compressor, payload, ctx)
    return payload, ctx


class CommBase:
    """Shared construction, byte booking and (empty) state of the compressed communicators."""

    traits: ClassVar[CommTraits] = CommTraits()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """`traits.sparse_results` and `traits.packs` are derived from the class (`derive`)."""
        super().__init_subclass__(**kwargs)
        cls.traits = derive(cls.traits, cls)

    def __init__(self, engine: Engine, compressor: Compressor, stats: StepStats) -> None:
        self.engine, self.compressor, self.stats = engine, compressor, stats
        self.blocking = self.traits.blocking

    @staticmethod
    def check_options(**options: Any) -> None:
        """Config-time check of the communicator's own options (`conf/comm/NAME.yaml` keys)."""

    def book(self, nbytes: int) -> None:
        """Book one compressed exchange that put `nbytes` of this rank's payloads on the wire."""
        self.stats.bytes_sent += nbytes
        self.stats.calls_compressed += 1

    def book_payload(self, payload: list[Tensor]) -> None:
        self.book(payload_nbytes(payload))

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class BlockingComm(CommBase):
    """A communicator that finishes the whole exchange inside `reduce` (a decode and re-encode at
    every server or hop): subclasses implement `exchange` -> (averaged tensor, bytes this rank sent;
    0 when it took the dense path, which books itself)."""

    traits: ClassVar[CommTraits] = CommTraits(blocking=True)

    def reduce(self, grad: Tensor, name: str, memory: Memory) -> Handle:
        averaged, sent = self.exchange(grad, name, memory)
        if sent:
            self.book(sent)
        return Handle.done(averaged)

    def exchange(self, x: Tensor, name: str, memory: Memory) -> tuple[Tensor, int]:
        raise NotImplementedError
