"""CUDA hot paths as CuPy RawKernels (sources in `extensions/cuda/*.cu`), used for CUDA tensors when
CuPy is installed (`pip install .[gpu]`); CPU hot paths as a torch C++ extension
(`extensions/cpu/*.cpp`, built by `make setup`: `compbench.kernels.cpu`).

Nothing here imports CuPy until a CUDA tensor asks for a kernel: CPU paths never touch it. Every
kernel has a pure-torch twin (`compbench.kernels.twins` or the compressor's own torch path) with the
same semantics, which runs wherever CuPy or CUDA is missing and which the parity tests compare it to.
`COMPBENCH_KERNELS=0` forces the torch twins on both devices (debugging, A/B timing).
"""

from __future__ import annotations

import os
from functools import cache

from torch import Tensor

from compbench.kernels import record
from compbench.kernels.cpu import enabled as cpu_kernels_enabled


def cuda_kernels_enabled(t: Tensor) -> bool:
    """Whether `t` is a CUDA tensor and the RawKernels can run on it (CuPy importable, not disabled);
    a CUDA tensor without them counts as a twin's run (`record`)."""
    if not t.is_cuda:
        return False
    if os.environ.get("COMPBENCH_KERNELS", "1") != "0" and cupy_importable():
        return True
    record.note("twin")
    return False


@cache
def cupy_importable() -> bool:
    try:
        import cupy  # noqa: F401
    except Exception:  # ImportError, or a CuPy build that does not match the driver
        return False
    return True


__all__ = ["cpu_kernels_enabled", "cuda_kernels_enabled", "cupy_importable"]
