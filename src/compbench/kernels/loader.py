"""One cached loader for the CUDA sources in `extensions/cuda/*.cu` (CuPy RawModules).

Imported only on CUDA paths: `import cupy` happens in here, never at package import. Each source is
compiled once per process by NVRTC (CuPy also caches the binary on disk, ~/.cupy/kernel_cache) and
every launch runs on torch's current CUDA stream, so kernels and torch ops stay ordered without a
synchronization. Tensors cross over with zero copies through DLPack (`cupy.from_dlpack`).
"""

from __future__ import annotations

import math
import os
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from compbench.kernels import record

# Threads per block of every launch; the grid is capped (kernels use grid-stride loops), which
# keeps launches cheap for huge n and still fills the GPU.
BLOCK = 256
_MAX_BLOCKS_PER_SM = 32


def source_dir() -> Path:
    """`extensions/cuda/`: $COMPBENCH_CUDA_DIR, else the repository's (editable install)."""
    env = os.environ.get("COMPBENCH_CUDA_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[3] / "extensions" / "cuda"
    if not path.is_dir():
        raise ValueError(f"no CUDA sources at {path}; set COMPBENCH_CUDA_DIR to the repository's "
                         "extensions/cuda")
    return path


def sources() -> list[Path]:
    """Every kernel source: the hand-written ones, sorted, then those generated from the CompLL specs
    (`compll_NAME.cu`, handed in through `compbench.base.kernel_sources`; the compile test and the
    host-shim test walk the same list)."""
    from compbench.base import kernel_sources

    return [*sorted(source_dir().glob("*.cu")), *kernel_sources.sources().cuda]


@cache
def module(name: str) -> Any:
    """The compiled RawModule of `extensions/cuda/NAME.cu` (cached per process)."""
    import cupy

    path = source_dir() / f"{name}.cu"
    if name.startswith("compll_"):
        from compbench.base import kernel_sources

        path = next((p for p in kernel_sources.sources().cuda if p.stem == name), path)
    if not path.is_file():
        raise ValueError(f"no CUDA source {path}")
    # -I: the sources include common.cuh; NVRTC has no standard headers, the sources need none.
    return cupy.RawModule(code=path.read_text(), options=("--std=c++14", f"-I{source_dir()}"))


@cache
def kernel(name: str, function: str, device_index: int = 0) -> Any:
    """`extern "C" __global__ void FUNCTION` of `NAME.cu`, loaded on GPU `device_index` (call it
    inside that device's context: CuPy loads a module per device)."""
    return module(name).get_function(function)


def as_cupy(t: Tensor) -> Any:
    """The same CUDA memory as a CuPy array (zero copy through DLPack); `t` must be contiguous."""
    import cupy

    if not t.is_contiguous():
        raise ValueError("kernels take contiguous tensors")
    return cupy.from_dlpack(t.detach())


@cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def launch(name: str, function: str, work: int, device: torch.device, args: tuple) -> None:
    """Launch FUNCTION of NAME.cu over `work` items on torch's current stream of `device`.

    `args` holds CuPy arrays (see `as_cupy`) and numpy scalars of the exact C types (np.int64 for
    long long, np.float32 for float, np.uint32 for unsigned int): CuPy would pass a Python int as
    a 64-bit and a Python float as a double.
    """
    import cupy

    if work <= 0:
        return
    record.note("compll_cuda" if name.startswith("compll_") else "cupy")
    index = device.index if device.index is not None else torch.cuda.current_device()
    blocks = max(1, min(math.ceil(work / BLOCK), _sm_count(index) * _MAX_BLOCKS_PER_SM))
    stream = torch.cuda.current_stream(index)
    with cupy.cuda.Device(index), cupy.cuda.ExternalStream(stream.cuda_stream):
        kernel(name, function, index)((blocks,), (BLOCK,), args)
