"""Error-feedback memory: what a compressor dropped is kept and added back next step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from compbench.codec.base import Compressor, Ctx
from compbench.codec.deferred import Deferred
from compbench.kernels import cpu, cuda_kernels_enabled


@dataclass(frozen=True)
class MemoryTraits:
    """What a memory is, declared once per class; the config check (compbench.compose.compat) reads it.

    feeds_back: keeps what the compressor dropped and adds it back next step.
    owns_momentum: applies SGD momentum itself to the tensors it compensates (DGC's momentum
      correction), so the optimizer must not apply it to them again: it needs optim=sgd.
    needs_sparse: works on the indices a sparsifier sent (`Capabilities.sparse`).
    state_passes: the passes over the compressed tensors it adds to the encode's one read, a read
      and a write per state tensor it keeps (compbench.records.floors prices the compress phase's floor).
    """

    feeds_back: bool = False
    owns_momentum: bool = False
    needs_sparse: bool = False
    state_passes: int = 0


@runtime_checkable
class Memory(Protocol):
    traits: MemoryTraits

    def compensate(self, g: Tensor, name: str) -> Tensor: ...
    def defer(self, g: Tensor, name: str) -> Deferred | None:
        """The compensation of `g` as a `Deferred` the compressor runs inside its selection pass, or
        None: the memory has nothing to fuse (none), its state is new (first step, a new shape), or
        the compiled kernels cannot run on these tensors; then `compensate` is called instead."""
        ...
    def update(self, x: Tensor, name: str, compressor: Compressor, payload: list[Tensor],
               ctx: Ctx) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, d: dict) -> None: ...


@runtime_checkable
class ScalesInput(Protocol):
    """A memory whose input scale follows a schedule set before each step (sync=demo: the learning
    rate enters DeMo's momentum, delta = decay * delta + lr * g)."""

    def scale_input(self, factor: float) -> None:
        """Multiply the input by `factor` (as well as by the memory's own setting) from now on."""
        ...


def fusable(*tensors: Tensor) -> bool:
    """Whether the compiled fused pass can run on these tensors (contiguous fp32 on one device whose
    kernels run: the CPU's built, CuPy's on a GPU; not disabled by COMPBENCH_KERNELS=0, which keeps
    the unfused twin path). A GPU without CuPy runs the twins, said once at the start
    (compbench.engines.device.check)."""
    if all(cpu.enabled(t) for t in tensors):
        return True
    return all(cuda_kernels_enabled(t) and t.dtype == torch.float32 and t.is_contiguous()
               and t.device == tensors[0].device for t in tensors)


NO_STATE = torch.empty(0)  # the unused `b` of a RESIDUAL compensation
