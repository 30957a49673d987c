"""The handle a memory gives a compressor that fuses its compensation into the selection pass
(`Capabilities.fuses_memory`, `Memory.defer`): both sides of the seam read it, so it lives here,
below compressors and memories alike.
"""

from __future__ import annotations

from torch import Tensor

from compbench.kernels import cpu


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
