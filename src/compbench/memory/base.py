"""Error-feedback memory: what a compressor dropped is kept and added back next step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from compbench.compressors.base import Compressor, Ctx
from compbench.kernels import cpu


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


class Deferred:
    """A memory's compensation of one gradient, not applied yet: the compressor runs it inside its
    own selection pass (`Capabilities.fuses_memory`), one compiled pass over the gradient and the
    memory's state (extensions/cpu/memory.cpp) instead of the memory's passes and then the
    compressor's. `at` reads compensated values before the pass (a threshold's samples); `summary`
    and `select` run the pass, which updates the memory's state in place exactly as `compensate`
    would (same bytes), and leave the compensated tensor (the memory's buffer) in `result`.

    kind, c0, c1, scale: `kernels.cpu.compensate_select`'s (RESIDUAL: beta, gamma; DGC: momentum,
    unused, the clipping factor or 1.0). `a`, `b`: the flat state (b empty for RESIDUAL).
    """

    def __init__(self, a: Tensor, b: Tensor, g: Tensor, kind: int, c0: float, c1: float, scale: float,
                 out: Tensor) -> None:
        self.a, self.b, self.g = a, b, g.reshape(-1)
        self.kind, self.c0, self.c1, self.scale = kind, c0, c1, scale
        self.out = out  # the memory's buffer the pass writes the compensated tensor into (g's shape)
        self.result: Tensor | None = None

    @property
    def numel(self) -> int:
        return self.g.numel()

    def at(self, indices: Tensor) -> Tensor:
        """The compensated values at flat int64 `indices` (fp32)."""
        if self.result is not None:
            return self.result.reshape(-1).index_select(0, indices)
        return cpu.compensate_at(self.a, self.b, self.g, indices.contiguous(), self.kind, self.c0, self.c1,
                                 self.scale)

    def _run(self, threshold: float, slots: int, seed: int, samples: Tensor | None = None, start: int = 0,
             stride: int = 1) -> tuple[Tensor, Tensor]:
        assert self.result is None, "a deferred compensation runs once"
        selected = cpu.compensate_select(self.a, self.b, self.g, self.kind, self.c0, self.c1, self.scale,
                                         threshold, slots, seed, samples, start, stride)
        self.result = self.out
        return self.out, selected

    def summary(self, samples: Tensor | None = None, start: int = 0,
                stride: int = 1) -> tuple[Tensor, Tensor]:
        """Run the pass: (compensated tensor, fp32 maxima of abs over each whole block of 64 elements,
        `kernels.cpu.block_absmax` of it). Given fp32 `samples` (m elements), the pass also writes
        the compensated values at start + t * stride into them (DGC's strided threshold sample,
        which would otherwise be a second, strided read of the result)."""
        return self._run(0.0, 0, 0, samples, start, stride)

    def select(self, threshold: float, slots: int, seed: int) -> tuple[Tensor, Tensor]:
        """Run the pass: (compensated tensor, `kernels.cpu.dragonn_select` of it: the selected indices)."""
        return self._run(threshold, slots, seed)

    def apply(self) -> Tensor:
        """Run the pass for the compensated tensor alone (the selection then reads it as usual)."""
        return self.summary()[0]


def fusable(*tensors: Tensor) -> bool:
    """Whether the compiled fused pass can run on these tensors (contiguous CPU fp32, kernels built
    and not disabled by COMPBENCH_KERNELS=0, which keeps the unfused twin path)."""
    return all(cpu.enabled(t) for t in tensors)


NO_STATE = torch.empty(0)  # the unused `b` of a RESIDUAL compensation
