"""Which kernels a run chose, counted per kind (scripts/gpu_check.py writes them into each row, so a
report says whether the CuPy kernels, CompLL's generated CUDA or the torch twins did the work).

Kinds: `cupy` (a hand-written RawKernel of extensions/cuda launched), `compll_cuda` (a CUDA kernel
generated from a CompLL spec launched), `cpu` (a compiled CPU kernel chosen), `twin` (a torch twin
chosen where a kernel could have run: `cuda_kernels_enabled` false on a CUDA tensor, the CPU kernels
not loaded or disabled for a CPU fp32 tensor). A count is a choice per call, not a measure of time.
"""

from __future__ import annotations

from collections import Counter

# A plain Counter: one `+= 1` per choice (the GIL keeps the threaded engine's ranks from losing
# more than an occasional count, which a report of which kinds ran does not notice).
_counts: Counter[str] = Counter()


def note(kind: str) -> None:
    """Count one choice of `kind`."""
    _counts[kind] += 1


def snapshot() -> dict[str, int]:
    """The counts so far (a copy)."""
    return dict(_counts)


def since(before: dict[str, int]) -> dict[str, int]:
    """The counts added after `before` (a `snapshot`), kinds with none left out."""
    return {k: v - before.get(k, 0) for k, v in sorted(_counts.items()) if v - before.get(k, 0)}
