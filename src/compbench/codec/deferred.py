"""The handle a memory gives a compressor that fuses its compensation into the selection pass
(`Capabilities.fuses_memory`, `Memory.defer`): both sides of the seam read it, so it lives here,
below compressors and memories alike.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor

from compbench.codec.finite import FiniteCheck, flag
from compbench.kernels import cpu, cuda_kernels_enabled


class Deferred:
    """A memory's compensation of one gradient, not applied yet: the compressor runs it inside its
    own selection pass (`Capabilities.fuses_memory`), one compiled pass over the gradient and the
    memory's state (extensions/cpu/memory.cpp on the CPU, extensions/cuda/memory.cu on a GPU: the
    kernels are chosen by the tensors' device, `memory.base.fusable`) instead of the memory's
    passes and then the compressor's. `at` reads compensated values before the pass (a threshold's
    samples); `summary` and `select` run the pass, which updates the memory's state in place exactly
    as `compensate` would (same bytes), and leave the compensated tensor (the memory's buffer) in
    `result`. On a GPU the pass fuses the compensation with DRAGONN's hashed selection (`select`);
    the block maxima of `summary` are the CPU's (a GPU's selection reads the result directly).

    kind, c0, c1, scale: `kernels.cpu.compensate_select`'s (RESIDUAL: beta, gamma; DGC: momentum,
    unused, the clipping factor or 1.0). `a`, `b`: the flat state (b empty for RESIDUAL).

    `check` (`summary`, `select`): the compressor's non-finite check of the raw gradient g, which
    the pass tests as it reads it (codec/finite.py), on both devices.
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

    @property
    def device(self) -> torch.device:
        return self.g.device

    def at(self, indices: Tensor) -> Tensor:
        """The compensated values at flat int64 `indices` (fp32, on the tensors' device)."""
        indices = indices.to(self.g.device)
        if self.result is not None:
            return self.result.reshape(-1).index_select(0, indices)
        kernels = _cuda() if cuda_kernels_enabled(self.g) else cpu
        return kernels.compensate_at(self.a, self.b, self.g, indices.contiguous(), self.kind, self.c0,
                                     self.c1, self.scale)

    def _run(self, threshold: float, slots: int, seed: int, samples: Tensor | None = None, start: int = 0,
             stride: int = 1, check: FiniteCheck | None = None) -> tuple[Tensor, Tensor | None]:
        assert self.result is None, "a deferred compensation runs once"
        self.result = self.out
        nonfinite = flag(check, self.g.device)
        if not cuda_kernels_enabled(self.g):  # the CPU's (`memory.base.fusable` chose one of the two)
            return self.out, cpu.compensate_select(self.a, self.b, self.g, self.kind, self.c0, self.c1,
                                                   self.scale, threshold, slots, seed, samples, start, stride,
                                                   nonfinite)
        table = _cuda().compensate_select(self.a, self.b, self.g, self.kind, self.c0, self.c1, self.scale,
                                          threshold, slots, seed, nonfinite=nonfinite)
        if samples is not None:  # the strided sample, read from the result (no block maxima on a GPU)
            samples.copy_(self.out.reshape(-1)[start::stride][: samples.numel()])
        # DRAGONN's filled slots, in slot order as on the CPU: the compaction must learn how many (a
        # host synchronization: the payload's size)
        return self.out, table[table >= 0].long() if slots else None

    def summary(self, samples: Tensor | None = None, start: int = 0, stride: int = 1,
                check: FiniteCheck | None = None) -> tuple[Tensor, Tensor | None]:
        """Run the pass: (compensated tensor, fp32 maxima of abs over each whole block of 64 elements,
        `kernels.cpu.block_absmax` of it; None on a GPU). Given fp32 `samples` (m elements), the pass
        also writes the compensated values at start + t * stride into them (DGC's strided threshold
        sample, which would otherwise be a second, strided read of the result)."""
        return self._run(0.0, 0, 0, samples, start, stride, check)

    def select(self, threshold: float, slots: int, seed: int,
               check: FiniteCheck | None = None) -> tuple[Tensor, Tensor]:
        """Run the pass: (compensated tensor, `kernels.cpu.dragonn_select` of it: the selected indices)."""
        y, selected = self._run(threshold, slots, seed, check=check)
        assert selected is not None
        return y, selected

    def apply(self) -> Tensor:
        """Run the pass for the compensated tensor alone (the selection then reads it as usual)."""
        return self.summary()[0]


def _cuda() -> ModuleType:
    """The CUDA launchers (`kernels.ops`), imported on CUDA paths only (CuPy)."""
    from compbench.kernels import ops

    return ops
