"""MurmurHash3_x86_32 of integer keys, in torch (any device) and numpy: DRAGONN's slot hash and the
counter-based random stream of every compbench kernel (`twins.counter_uniform`). It lives with the
kernels because the compiled kernels and their torch twins must agree on it bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

M32 = 0xFFFFFFFF


def _mul32(a: Tensor, c: int) -> Tensor:
    """(a * c) mod 2^32 for 0 <= a < 2^32, in int64 without overflow: c is split in 16-bit halves."""
    lo, hi = c & 0xFFFF, c >> 16
    return (a * lo + (((a * hi) & 0xFFFF) << 16)) & M32


def _rotl32(a: Tensor, r: int) -> Tensor:
    return ((a << r) | (a >> (32 - r))) & M32


def _fmix32(h: Tensor) -> Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def murmur3_32(keys: Tensor, seed: int) -> Tensor:
    """MurmurHash3_x86_32 of each key taken as a 4-byte little-endian integer (int64 result in [0, 2^32)).

    Vectorized in int64 arithmetic masked to 32 bits, so it runs wherever torch does; keys are
    reduced mod 2^32 first.
    """
    k = keys.to(torch.int64) & M32
    k = _mul32(k, 0xCC9E2D51)
    k = _rotl32(k, 15)
    k = _mul32(k, 0x1B873593)
    h = k ^ (int(seed) & M32)
    h = _rotl32(h, 13)
    h = (_mul32(h, 5) + 0xE6546B64) & M32
    h = h ^ 4  # length in bytes
    return _fmix32(h)


U32 = np.uint32


def murmur3_32_np(keys: np.ndarray, seed: int) -> np.ndarray:
    """`murmur3_32` in numpy uint32 arithmetic (wraps mod 2^32 by definition): ~10x faster on CPU."""
    k = keys.astype(np.uint32)
    k *= U32(0xCC9E2D51)
    k = (k << U32(15)) | (k >> U32(17))
    k *= U32(0x1B873593)
    h = k ^ U32(int(seed) & M32)
    h = (h << U32(13)) | (h >> U32(19))
    h = h * U32(5) + U32(0xE6546B64)
    h ^= U32(4)  # length in bytes
    h ^= h >> U32(16)
    h *= U32(0x85EBCA6B)
    h ^= h >> U32(13)
    h *= U32(0xC2B2AE35)
    h ^= h >> U32(16)
    return h
