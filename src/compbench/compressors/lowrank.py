"""Shared helpers of the low-rank compressors (`atomo`, `powersgd`).

Both see a gradient as a matrix: a tensor of shape (out, d1, d2, ...) becomes (out, d1*d2*...), so a
conv weight (out, in, kh, kw) is (out, in*kh*kw), the layout in which its gradient is closest to low
rank. Tensors with fewer than two dimensions have no useful matrix form and are sent dense in fp32.
"""

from __future__ import annotations

import hashlib
import math
import os

import torch
from torch import Tensor


def matrix_shape(shape: torch.Size | tuple[int, ...]) -> tuple[int, int] | None:
    """(rows, cols) of the 2-D view of a tensor of `shape`, or None for 0-D and 1-D tensors."""
    if len(shape) < 2:
        return None
    return int(shape[0]), math.prod(shape[1:])


def as_matrix(x: Tensor) -> Tensor | None:
    """The 2-D view (rows = shape[0], cols = the rest) of `x`, or None for 0-D and 1-D tensors."""
    rc = matrix_shape(x.shape)
    return None if rc is None else x.reshape(rc)


def dense_payload(x: Tensor) -> list[Tensor]:
    """The fp32 dense form used for tensors a low-rank compressor does not compress."""
    return [x.reshape(-1).to(torch.float32).contiguous()]


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from `parts`, identical in every process (Python's hash() is salted per process)."""
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def process_rank() -> int:
    """This process's data-parallel rank from the launcher's environment (RANK, then HOROVOD_RANK; 0)."""
    for key in ("RANK", "HOROVOD_RANK"):
        value = os.environ.get(key)
        if value not in (None, ""):
            return int(value)
    return 0


def cpu_generator(seed: int) -> torch.Generator:
    """A CPU generator: draws are then identical on every device type (a CUDA generator's are not)."""
    return torch.Generator().manual_seed(seed)
