"""Which tensors are compressed: policy shared by every compressor (DGC, DRAGONN and HiPress rules).

A tensor goes dense (fp32 allreduce, no error feedback) when it has fewer than `min_dims` dimensions
(DGC sends 1-D tensors dense), at most `compress_threshold` elements (DRAGONN / HiPress selective
compression) or during the first `dense_steps` steps (warm-up).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class Selection:
    min_dims: int = 1
    compress_threshold: int = 0
    dense_steps: int = 0

    def __post_init__(self) -> None:
        if self.min_dims < 0 or self.compress_threshold < 0 or self.dense_steps < 0:
            raise ValueError("compressor.min_dims, compress_threshold and dense_steps must be >= 0")

    def compresses(self, t: Tensor, step: int) -> bool:
        return step >= self.dense_steps and t.dim() >= self.min_dims and t.numel() > self.compress_threshold
