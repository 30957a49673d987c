"""The compression seam: what every compressor, memory and communicator agrees on.

A compressor turns one flat-or-shaped fp32 tensor into a *payload*: the exact list of tensors that
goes on the wire. Everything needed to decode a peer's payload that is not in the payload must be the
same on every rank (shape, dtype, numel, hyper-parameters): that is the `Ctx`. Anything rank-dependent
(scales, norms, selected indices, counts) travels inside the payload, as 1-element tensors for scalars
(0-dim tensors break Horovod's allgather).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeGuard, TypeVar, runtime_checkable

import torch
from torch import Tensor

from compbench.base.values import KeyRange, show
from compbench.codec.finite import FiniteLedger

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


@dataclass
class Ctx:
    """Rank-independent facts needed to decode a payload of tensor `name`."""

    name: str
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def make_ctx(x: Tensor, name: str, **meta: Any) -> Ctx:
    return Ctx(name=name, shape=x.shape, dtype=x.dtype, device=x.device, meta=meta)


@dataclass(frozen=True)
class Capabilities:
    """What a compressor is, declared once per class: the config check (compbench.compose.compat), the
    communicators and the recipes read only this record, never the class itself.

    The flags that promise a method (sparse, shared_indices, collective, decodes_into,
    sparse_average, fuses_memory, random_sample, split_unit, combine="vote") are derived from the
    class (`derive`, `PROMISES`): a class that implements the flag's Protocol gets it, and a class
    that declares it without the method is refused when it is defined.

    summable: payloads of different ranks may be summed element-wise by an allreduce and the sum
      decoded once (linear decode, the same layout on every rank: none, fp16, shared-seed randk).
    collective: runs its own collective protocol over comm=allreduce (PowerSGD's two rounds), with
      its own error feedback there.
    unbiased: E[decode(encode(x))] = x.
    combine: how the ranks' decoded tensors combine: "mean", or "vote" (signum's majority vote; a
      parameter server then sends the vote's sign, `server_compress`), or "sender_mean" (sparseloco:
      per coordinate, the mean over the ranks that sent it, after clipping each rank's values to the
      median norm; partial sums cannot carry it, so comm=ring refuses it as it refuses "vote").
    owns: state the compressor keeps itself: "error_feedback" (tbq's residual), "momentum" (signum).
    min_dims: dimensions a tensor needs to be compressed at all (2: matrices; ATOMO and PowerSGD
      send a 1-D tensor, and so a fused flat buffer, dense).
    sparse: sends selected elements and names them: `sent_indices` (DGC's momentum masking) and
      `sparse_entries` (indices and values whose scatter-add is the decode: error feedback in O(k)).
    shared_indices: the selected indices come from a seed shared by every rank (`indices`): only
      values travel, and a peer's indices are drawn again on decode.
    lossless: decode(encode(x)) = x; error feedback would have nothing to feed back.
    identity: the payload is the tensor itself, unchanged (none): comm=allreduce then averages the
      gradient in place, as the dense path does (no copy out, none back, DDP's bucket-sized chunks).
    decodes_into: `decompress_all(payloads, ctx, out=buf)` decodes into a caller's flat buffer
      (`buffers.check_out`): comm=allgather then decodes straight into the gradient it was handed
      (a .grad, or the fused buffer the .grads view), so nothing is copied back.
    sparse_average: `decompress_all_sparse(payloads, ctx)` returns `decompress_all`'s average as a
      coalesced sparse COO tensor (the decoded sparse payload, same values at its indices, 0
      elsewhere): comm=allgather hands it to an optimizer that steps from it in one pass.
    fuses_memory: `compress_deferred(deferred, name)` compresses a compensation an error-feedback
      memory deferred (`codec.deferred.Deferred`), running it inside its own selection pass: the
      memory's update and the selection are one compiled pass per tensor (dgc, topk, dragonn).
    random_sample: `sampled_reads(numel)` is how many elements of a tensor of `numel` the encode
      reads at random places besides its pass over the tensor (a threshold's uniform sample): cache
      misses the algorithm itself makes, which the compress phase's floor counts (compbench.records.floors).
    shape_layout: the payload's layout (its tensors, dtypes and shapes) follows from the tensor's
      shape and the step alone, the same on every rank, though `wire_bytes(numel)` cannot say it
      (chunks and matrices follow the shape: chunk_dct, sparseloco, powersgd): comm=allgather and
      comm=ps then send it without a size header or padding, as they do when `wire_bytes` is exact.
    split_unit: the payload of a whole tensor can be cut at multiples of this many elements
      (`split(payload, ctx, bounds, names)`: one payload per flat element range): comm=ps then
      compresses a tensor once and sends each server its part; 0: it cannot.
    recipe: known-good settings applied unless the user sets the key ("memory", "optim.lr",
      "optim.momentum", "optim.warmup_epochs"; optimizer keys apply to optim=sgd, the optimizer they
      were tuned with).
    why_not_summable: completes "compressor=X ...; use comm=allgather or comm=ps".
    """

    summable: bool = False
    collective: bool = False
    unbiased: bool = False
    combine: str = "mean"
    owns: frozenset[str] = frozenset()
    min_dims: int = 1
    sparse: bool = False
    shared_indices: bool = False
    lossless: bool = False
    identity: bool = False
    decodes_into: bool = False
    sparse_average: bool = False
    fuses_memory: bool = False
    random_sample: bool = False
    shape_layout: bool = False
    split_unit: int = 0
    recipe: Mapping[str, Any] = field(default_factory=dict)  # read-only by convention (deep-copyable)
    why_not_summable: str = "sends rank-dependent payloads that cannot be summed element-wise"


# The recipe of a biased compressor under residual error feedback. Momentum applied to the sparse
# aggregate of error-compensated gradients is what DGC's momentum correction exists for: on digits
# (6 epochs, allgather) topk reached 80.0% with momentum 0.9, 97.8% with momentum 0 at lr 0.1 and
# 98.9% at lr 0.3; dragonn 67.8% -> 97.8%, graddrop 68.6% -> 97.8%, randk 17.8% -> 70.3%.
ERROR_FEEDBACK_RECIPE = {"memory": "residual", "optim.momentum": 0.0, "optim.lr": 0.3}


@runtime_checkable
class Compressor(Protocol):
    name: str
    caps: Capabilities

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]: ...
    def decompress(self, payload: list[Tensor], ctx: Ctx) -> Tensor: ...
    def decompress_all(self, payloads: list[list[Tensor]], ctx: Ctx) -> Tensor: ...
    def wire_bytes(self, numel: int) -> int | None: ...
    def max_wire_bytes(self, numel: int) -> int: ...
    def begin_step(self, step: int, epoch: float) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...

    @property
    def finite(self) -> FiniteLedger:
        """The gradients this step's compiled passes checked for NaN/Inf (codec/finite.py); opened
        by `begin_step`, read by the trainer's non-finite check."""
        ...


class CompressorBase:
    """Shared defaults. Subclasses set `name` and `caps` and implement compress/decompress."""

    name: str = "base"
    caps: Capabilities = Capabilities()
    # The ranges of settings the constructor's types do not say (compbench.compose.checks; a subclass with
    # more merges these in).
    KEY_RANGES: ClassVar[dict[str, KeyRange]] = {"seed": KeyRange(0)}
    # Compressors whose decode of N payloads can be fused (e.g. one scatter-add) override this.
    step: int = 0
    epoch: float = 0.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """The flags that promise a method are derived from the class (`derive`): refused where a
        class declares one without its method, set where it has the method."""
        super().__init_subclass__(**kwargs)
        cls.caps = derive(cls.caps, cls)

    def begin_step(self, step: int, epoch: float) -> None:
        """Called by the trainer before each optimizer step (for seeds, warm-ups, schedules); opens
        this step's non-finite ledger."""
        self.step = step
        self.epoch = epoch
        self.finite.begin_step()

    @property
    def finite(self) -> FiniteLedger:
        """This compressor's `FiniteLedger` (made on first use: subclasses need not call an
        __init__ here). The sparsifiers whose selection pass is a compiled kernel record there the
        tensors that pass checked for NaN/Inf; the others record nothing."""
        ledger = self.__dict__.get("_finite")
        if ledger is None:
            ledger = self.__dict__["_finite"] = FiniteLedger()
        return ledger

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        raise NotImplementedError

    def decompress(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        raise NotImplementedError

    def aggregate(self, decoded: list[Tensor]) -> Tensor:
        """Average of the decoded tensors of all ranks."""
        out = decoded[0].clone() if len(decoded) == 1 else torch.stack(decoded).sum(0)
        return out.div_(len(decoded))

    def decompress_all(self, payloads: list[list[Tensor]], ctx: Ctx) -> Tensor:
        """Decode every rank's payload and aggregate; sparse compressors fuse this."""
        return self.aggregate([self.decompress(p, ctx) for p in payloads])

    def wire_bytes(self, numel: int) -> int | None:
        """Exact payload bytes for a tensor of `numel` elements (ALGORITHMS.md), or None when they
        depend on the data (then `max_wire_bytes` bounds them). The contract tests check it."""
        return None

    def max_wire_bytes(self, numel: int) -> int:
        """Upper bound of the payload bytes (the budget a sparsifier must never exceed)."""
        exact = self.wire_bytes(numel)
        assert exact is not None, f"{self.name} must define wire_bytes or max_wire_bytes"
        return exact

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


# -- the capabilities that promise a method: one small Protocol each ---------------------------------

@runtime_checkable
class SparseEntries(Protocol):
    """`Capabilities.sparse`: the payload names the elements it sends."""

    def sent_indices(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        """Flat indices this payload carries (memory=dgc masks its momentum there)."""
        ...

    def sparse_entries(self, payload: list[Tensor], ctx: Ctx) -> tuple[Tensor, Tensor]:
        """(flat indices, values) whose scatter-add into zeros is the decode (memory=residual)."""
        ...


@runtime_checkable
class SharedIndices(Protocol):
    """`Capabilities.shared_indices`: every rank draws the same indices from a shared seed."""

    def indices(self, numel: int, name: str, device: torch.device | str = "cpu") -> Tensor: ...


@runtime_checkable
class CollectiveCompressor(Protocol):
    """`Capabilities.collective`: its own collective protocol over comm=allreduce."""

    def compress_collective(self, x: Tensor, name: str,
                            allreduce_mean: Callable[[Tensor], Tensor]) -> tuple[Tensor, int]:
        """(the average of `x` over the ranks, the bytes this rank sent), the collectives issued
        through `allreduce_mean`."""
        ...


@runtime_checkable
class DecodesInto(Protocol):
    """`Capabilities.decodes_into`: `decompress_all` decodes into a caller's flat buffer."""

    def decompress_all(self, payloads: list[list[Tensor]], ctx: Ctx, out: Tensor | None = None) -> Tensor: ...


@runtime_checkable
class SparseAverage(Protocol):
    """`Capabilities.sparse_average`: the average as a coalesced sparse COO tensor."""

    def decompress_all_sparse(self, payloads: list[list[Tensor]], ctx: Ctx) -> Tensor: ...


D_contra = TypeVar("D_contra", contravariant=True)


@runtime_checkable
class FusesMemory(Protocol[D_contra]):
    """`Capabilities.fuses_memory`: compresses a memory's deferred compensation in one pass. `D_contra`
    is `codec.deferred.Deferred`, which this module cannot import (the deferred pass runs the
    kernels, which import the codec): `FusesMemory[Deferred]` where it is used."""

    def compress_deferred(self, deferred: D_contra, name: str) -> tuple[list[Tensor], Ctx]:
        """The payload of the compensated tensor; runs `deferred` (sets `deferred.result`)."""
        ...


@runtime_checkable
class SamplesAtRandom(Protocol):
    """`Capabilities.random_sample`: the encode reads a uniform sample besides its pass."""

    def sampled_reads(self, numel: int) -> int: ...


@runtime_checkable
class SplitsPayload(Protocol):
    """`Capabilities.split_unit` (non-zero): a whole tensor's payload cut into parts."""

    def split(self, payload: list[Tensor], ctx: Ctx, bounds: list[tuple[int, int]],
              names: list[str]) -> list[tuple[list[Tensor], Ctx]]:
        """The payload of each flat element range of `bounds` (each starting at a multiple of
        `split_unit`, or empty) of the whole tensor's `payload`, with its ctx named `names[i]`."""
        ...


@runtime_checkable
class VoteServer(Protocol):
    """`Capabilities.combine` "vote": a parameter server sends the vote's sign."""

    def server_compress(self, vote: Tensor, name: str) -> tuple[list[Tensor], Ctx]: ...


# -- narrowing by the flag: a flag is derived from its Protocol, so a compressor with it implements
# it (a record read, where isinstance on a Protocol costs microseconds per tensor) ---------------

def is_sparse(c: Compressor) -> TypeGuard[SparseEntries]:
    return c.caps.sparse


def shares_indices(c: Compressor) -> TypeGuard[SharedIndices]:
    return c.caps.shared_indices


def is_collective(c: Compressor) -> TypeGuard[CollectiveCompressor]:
    return c.caps.collective


def decodes_into(c: Compressor) -> TypeGuard[DecodesInto]:
    return c.caps.decodes_into


def averages_sparse(c: Compressor) -> TypeGuard[SparseAverage]:
    return c.caps.sparse_average


def fuses_memory(c: Compressor) -> TypeGuard[FusesMemory[Any]]:
    return c.caps.fuses_memory


def samples_at_random(c: Compressor) -> TypeGuard[SamplesAtRandom]:
    return c.caps.random_sample


def votes(c: Compressor) -> TypeGuard[VoteServer]:
    return c.caps.combine == "vote"


# -- flags derived from the class ---------------------------------------------------------------

# Record type -> {field: the Protocol whose members the field promises}. Each seam registers its
# record's (compbench.comm.base registers CommTraits'); a boolean field is true exactly when the
# class implements the Protocol, "combine" promises VoteServer where it is "vote", an int field where
# it is non-zero.
PROMISES: dict[type, dict[str, type]] = {
    Capabilities: {"sparse": SparseEntries, "shared_indices": SharedIndices,
                   "collective": CollectiveCompressor, "decodes_into": DecodesInto,
                   "sparse_average": SparseAverage, "fuses_memory": FusesMemory,
                   "random_sample": SamplesAtRandom, "split_unit": SplitsPayload, "combine": VoteServer},
}

R = TypeVar("R", bound="DataclassInstance")


def protocol_members(proto: type) -> dict[str, list[str] | None]:
    """What `proto` declares: each method with its parameter names (after self), each data member
    (an annotation) as None."""
    members: dict[str, list[str] | None] = {}
    for klass in reversed(proto.__mro__):
        if Protocol not in klass.__bases__:
            continue
        members.update(dict.fromkeys(vars(klass).get("__annotations__", {})))
        for name, value in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(value, staticmethod):
                members[name] = list(inspect.signature(value.__func__).parameters)
            elif inspect.isfunction(value):
                members[name] = list(inspect.signature(value).parameters)[1:]
            else:  # a property or a class attribute
                members[name] = None
    return members


def implements(cls: type, proto: type) -> bool:
    """Whether class `cls` has what `proto` declares: each method, taking the protocol's parameters
    by name (or any keywords), and each data member, as class attributes. A member set to None
    (`decompress_all_sparse = None`) is not implemented."""
    for name, params in protocol_members(proto).items():
        value = getattr(cls, name, None)
        if value is None:
            return False
        if params is None:
            continue
        if not callable(value):
            return False
        try:
            taken = inspect.signature(value).parameters
        except (TypeError, ValueError):  # a builtin without a signature: its name is all there is
            continue
        any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in taken.values())
        if not any_keyword and not set(params) <= set(taken):
            return False
    return True


def describe(proto: type) -> str:
    """The members of `proto` as a reader writes them: `split(payload, ctx, bounds, names)`."""
    return " and ".join(name if params is None else f"{name}({', '.join(params)})"
                        for name, params in protocol_members(proto).items()) + f" ({proto.__name__})"


def derive(record: R, cls: type) -> R:
    """`record` (a frozen dataclass) as class `cls` has it: each field of `PROMISES` set where `cls`
    implements the field's Protocol. TypeError, naming the class, the field and the method, where
    the record declares a field `cls` does not implement, or where a field that is not a boolean
    (split_unit, combine) does not say what the method it implements does."""
    changes: dict[str, bool] = {}
    for flag, proto in PROMISES.get(type(record), {}).items():
        value = getattr(record, flag)
        declared = value == "vote" if isinstance(value, str) else bool(value)
        has = implements(cls, proto)
        who = f"{cls.__module__}.{cls.__qualname__}"
        if declared and not has:
            raise TypeError(f"{who} declares {flag}={value!r} but has no {describe(proto)}; "
                            f"implement it, or do not declare {flag}")
        if has and not declared:
            if not isinstance(value, bool):
                raise TypeError(f"{who} has {describe(proto)} but declares {flag}={value!r}; "
                                f"declare the {flag} its method serves")
            changes[flag] = True
    return replace(record, **changes) if changes else record


def same_layout(compressor: Compressor, shape: torch.Size) -> bool:
    """Whether every rank's payload for a tensor of `shape` has the same layout (tensors, dtypes,
    shapes), known before it is sent: exact `wire_bytes`, or `Capabilities.shape_layout`."""
    return compressor.caps.shape_layout or compressor.wire_bytes(math.prod(shape)) is not None


def payload_nbytes(payload: list[Tensor]) -> int:
    """Exact bytes a payload puts on the wire."""
    return sum(t.numel() * t.element_size() for t in payload)


def check_ratio(ratio: float, who: str) -> float:
    # A list, a string or a bool from the command line (`ratio=[1,2]`, `ratio=abc`) is the user's
    # typo, not a number to convert; NaN fails the interval test.
    number = isinstance(ratio, int | float) and not isinstance(ratio, bool)
    if not number or not (0 < float(ratio) <= 1):
        raise ValueError(f"{who}: ratio={show(ratio)} is outside (0, 1]; pass e.g. ratio=1e-3")
    return float(ratio)


def num_selected(numel: int, ratio: float) -> int:
    """k = ceil(n * r), at least 1."""
    return max(1, math.ceil(numel * ratio))
