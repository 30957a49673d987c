"""Error-feedback memory: what a compressor dropped is kept and added back next step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import Tensor

from compbench.compressors.base import Compressor, Ctx


@dataclass(frozen=True)
class MemoryTraits:
    """What a memory is, declared once per class; the config check (compbench.compat) reads it.

    feeds_back: keeps what the compressor dropped and adds it back next step.
    owns_momentum: applies SGD momentum itself to the tensors it compensates (DGC's momentum
      correction), so the optimizer must not apply it to them again: it needs optim=sgd.
    needs_sparse: works on the indices a sparsifier sent (`Capabilities.sparse`).
    state_passes: the passes over the compressed tensors it adds to the encode's one read, a read
      and a write per state tensor it keeps (compbench.floors prices the compress phase's floor).
    """

    feeds_back: bool = False
    owns_momentum: bool = False
    needs_sparse: bool = False
    state_passes: int = 0


@runtime_checkable
class Memory(Protocol):
    traits: MemoryTraits

    def compensate(self, g: Tensor, name: str) -> Tensor: ...
    def update(self, x: Tensor, name: str, compressor: Compressor, payload: list[Tensor],
               ctx: Ctx) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, d: dict) -> None: ...
