"""The compression seam in plain sight: memory -> compressor -> communicator -> averaged gradient.

`submit` starts one tensor (or fused group) on its way as soon as the scheduler hands it over,
`submit_many` several tensors in one exchange (each compressed on its own, their payloads in one
collective per stage: scheduler=bucket, DiLoCo's outer gradient); `collect` waits for all of them (or
the oldest few) in submission order and returns the averaged dense gradients, or,
for the `sparse_names` the synchronizer chose, the averaged sparse payload as a coalesced COO tensor
that the optimizer steps from in one pass (no dense zero-fill, scatter and re-read).
Every rank submits the same names in the same order (the collectives must match).

Time booked: `comm` is the time this thread spends starting and waiting for collectives (decoding
and compression inside them are booked as `decompress` / `compress`); `comm_exposed` is the part
of it after back-propagation ended, i.e. not hidden behind compute (there it includes decoding,
since the step waits for it too). Overlapping schedulers set `in_backward` while their backward
hooks submit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from compbench.codec.base import Compressor, samples_at_random
from compbench.comm.base import Communicator, PackingCommunicator, packs, sparse_results
from compbench.engines.base import Engine, Handle, flat_average
from compbench.memory.base import Memory
from compbench.records.stats import StepStats
from compbench.seam.selection import Selection


class GradientPipeline:
    def __init__(self, engine: Engine, compressor: Compressor, memory: Memory, comm: Communicator,
                 selection: Selection, stats: StepStats) -> None:
        self.engine, self.compressor, self.memory, self.comm = engine, compressor, memory, comm
        self.selection, self.stats = selection, stats
        self.step = 0
        self.in_backward = False  # set by overlapping schedulers: communication started now is hidden
        # on_nonfinite=skip with an overlapping scheduler: groups are compressed from backward hooks,
        # before the trainer's finiteness check; a NaN would enter the error-feedback memory for good.
        self.guard_nonfinite = False
        # Set by a synchronization mode for the coming step: every tensor takes the dense path
        # (sync=onebit_adam's warm-up), whatever the selection rules say.
        self.dense_now = False
        # (names, handle, packed): a packed handle gives a list of results, one per name
        self._pending: list[tuple[list[str], Handle, bool]] = []

    @property
    def sparse_names(self) -> frozenset[str]:
        """Tensors whose optimizer steps from the decoded sparse payload (a coalesced COO .grad) in
        one pass: a communicator with `traits.sparse_results` hands their average back undecoded."""
        return self.comm.sparse_names if sparse_results(self.comm) else frozenset()

    @sparse_names.setter
    def sparse_names(self, names: frozenset[str]) -> None:
        if sparse_results(self.comm):
            self.comm.sparse_names = frozenset(names)

    def begin_step(self, step: int, epoch: float) -> None:
        self.step = step
        self.compressor.begin_step(step, epoch)

    @property
    def can_pack(self) -> bool:
        """Whether `submit_many` sends its compressed tensors in one exchange (the communicator
        packs this compressor, `comm.base.packs`); otherwise each goes through `submit`."""
        return packs(self.comm.traits, self.compressor.caps)

    @property
    def can_overlap(self) -> bool:
        """False for communicators that block for the whole exchange (comm=ps, ring, PowerSGD's two
        allreduces): called from a backward hook they would stall back-propagation, so schedulers
        submit after it instead."""
        return not self.comm.blocking

    def compresses(self, grad: Tensor, fused: bool = False) -> bool:
        """The selection rules at this step. A fused group's members passed `min_dims` one by one
        (its flat buffer is 1-D), so only the size threshold and the warm-up apply to the group."""
        sel = self.selection
        if self.dense_now:
            return False
        if fused:
            return self.step >= sel.dense_steps and grad.numel() > sel.compress_threshold
        return sel.compresses(grad, self.step)

    def submit(self, name: str, grad: Tensor, *, fused: bool = False, dense: bool = False,
               members: list[tuple[str, int]] | None = None) -> None:
        """Start `grad` on its way. `fused`: a flat group of tensors (see `compresses`); `dense`: send
        it uncompressed whatever the rules say (MergeComp's first step). `members`: the (name, numel)
        of the gradients a fused group's flat buffer holds, in order, so that a compiled pass's
        non-finite check of the buffer checks them (codec/finite.py)."""
        self.stats.bytes_dense += grad.numel() * 4
        compress = not dense and self.compresses(grad, fused)
        if compress:
            if members is not None:
                self.compressor.finite.group(name, members)
            grad = self._prepare(grad)
        with self._communicating(exposed=not self.in_backward):
            handle = self.comm.reduce(grad, name, self.memory) if compress else self._dense(grad, name)
        self._pending.append(([name], handle, False))

    def submit_many(self, name: str, items: list[tuple[str, Tensor]], *, dense: bool = False) -> None:
        """Start every (name, tensor) of `items` on its way in one exchange named `name`: each
        compressed on its own under its own name (memory, compressor state and selection rules as
        `submit` would), their payloads in one collective per stage (`PackingCommunicator`); the
        tensors the rules send dense go as one flat allreduce. Needs `can_pack`."""
        assert self.can_pack, "submit_many needs a communicator that packs this compressor"
        compressed, plain = [], []
        for item, grad in items:
            self.stats.bytes_dense += grad.numel() * 4
            if not dense and self.compresses(grad):
                compressed.append((item, self._prepare(grad)))
            else:
                plain.append((item, grad))
        with self._communicating(exposed=not self.in_backward):
            if compressed:
                assert isinstance(self.comm, PackingCommunicator)  # can_pack: CommTraits.packs
                handle = self.comm.reduce_many(name, compressed, self.memory)
                self._pending.append(([n for n, _ in compressed], handle, True))
            if plain:
                self._pending.append(([n for n, _ in plain], self._dense_many(f"{name}.dense", plain), True))

    def _prepare(self, grad: Tensor) -> Tensor:
        """Before a tensor is compressed: the sampled reads its encode makes are booked, and a
        non-finite one is zeroed where the step is going to be dropped (`guard_nonfinite`:
        on_nonfinite=skip with an overlapping scheduler only). The choice is the device's, not the
        host's: a flag read per group inside backward hooks would be a wait each on a GPU; the
        price is a copy of each compressed group (the .grad itself is left alone: the trainer's
        check must still see the NaN)."""
        if self.guard_nonfinite:  # the trainer skips such a step anyway; keep the memory finite
            grad = torch.where(torch.isfinite(grad).all(), grad, torch.zeros((), dtype=grad.dtype,
                                                                             device=grad.device))
        if samples_at_random(self.compressor):
            self.stats.sampled_reads += self.compressor.sampled_reads(grad.numel())
        return grad

    def _dense(self, grad: Tensor, name: str) -> Handle:
        """The uncompressed path: the gradient averaged over the ranks in place (it is the .grad or
        the fused buffer the .grads view, so nothing is copied back)."""
        self.stats.add_dense_allreduce(grad.numel() * grad.element_size(), calls=1)
        return self.engine.allreduce_inplace_async(grad, name)

    def _dense_many(self, name: str, items: list[tuple[str, Tensor]]) -> Handle:
        """The uncompressed path for several tensors: one flat buffer per dtype averaged in place
        (a copy in and views out; the scheduler lands them in the .grads)."""
        grads = [grad for _, grad in items]
        if len(grads) == 1:
            handle = self._dense(grads[0], name)
            return Handle(lambda: [handle.wait()])
        dtypes = {g.dtype for g in grads}
        self.stats.add_dense_allreduce(sum(g.numel() * g.element_size() for g in grads), calls=len(dtypes))
        return flat_average(self.engine, name, grads)

    @property
    def in_flight(self) -> int:
        """How many submitted groups `collect` has not waited for yet (a `submit` adds one, a
        `submit_many` one or two: its compressed and its dense tensors)."""
        return len(self._pending)

    def collect(self, groups: int | None = None) -> list[tuple[str, Tensor]]:
        """Wait for every submitted group (in submission order), or only for the oldest `groups` of
        them (sync=delayed_diloco keeps later rounds' exchanges in flight); call after
        back-propagation."""
        self.in_backward = False
        count = len(self._pending) if groups is None else groups
        done, self._pending = self._pending[:count], self._pending[count:]
        out: list[tuple[str, Tensor]] = []
        for names, handle, packed in done:
            with self._communicating(exposed=True):
                result = handle.wait()
            out.extend(zip(names, result, strict=True) if packed else [(names[0], result)])
        return out

    @contextmanager
    def _communicating(self, exposed: bool) -> Iterator[None]:
        """Time the block as communication (the encoding and decoding inside it time themselves);
        when the step waits for it (`exposed`), its communication and decoding count as exposed."""
        with self.stats.time("comm", exposed=exposed):
            yield
