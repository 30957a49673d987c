"""Pure-torch twins of the kernels that have no torch path elsewhere: the counter-based random
stream and the quantizers that draw from it. They run on any device (CPU included), give the very
bits of `extensions/cuda/quantize.cu` and `tbq.cu`, and are what the parity tests compare against.
The other kernels' twins are the compressors' own torch paths (packing.py, dragonn._select,
torch.nonzero, index_add_).
"""

from __future__ import annotations

import torch
from torch import Tensor

from compbench.kernels.hashing import murmur3_32


def ternary_codes(q: Tensor) -> Tensor:
    """uint8 2-bit codes of an int8 tensor with values in {-1, 0, 1}: 0 -> 0, 1 -> +1, 3 -> -1, the
    low two bits of the two's complement value (a CUDA kernel produces them without branches)."""
    return q.view(torch.uint8) & 3


def pack_2bit_torch(codes: Tensor) -> Tensor:
    """Pack uint8 codes in 0..3 four to a byte (code i at bits 2*(i % 4)) on any device: the rows of
    four codes read as int32 and gathered by shift-or (no multiplication, so no overflow)."""
    pad = (-codes.numel()) % 4
    flat = codes.reshape(-1)
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    w = flat.contiguous().view(torch.int32)
    return ((w | (w >> 6) | (w >> 12) | (w >> 18)) & 0xFF).to(torch.uint8)


def counter_uniform(seed: int, n: int, device: torch.device | str = "cpu") -> Tensor:
    """U[0, 1) for elements 0..n-1: (murmur3_32(i mod 2^32, seed) >> 8) * 2^-24, fp32 (exact)."""
    keys = torch.arange(n, dtype=torch.int64, device=device)
    return (murmur3_32(keys, seed) >> 8).to(torch.float32).mul_(2.0**-24)


def bucket_norms(flat: Tensor, bucket_size: int) -> Tensor:
    """||bucket||_2 of each bucket of `bucket_size` elements (the last may be shorter): QSGD's payload."""
    full = flat.numel() // bucket_size
    parts = []
    if full:
        parts.append(torch.linalg.vector_norm(flat[: full * bucket_size].view(full, bucket_size), dim=1))
    if flat.numel() % bucket_size:
        parts.append(torch.linalg.vector_norm(flat[full * bucket_size :]).reshape(1))
    return torch.cat(parts) if parts else flat.new_zeros(0)


def qsgd_scale(norms: Tensor, levels: int) -> Tensor:
    """QSGD's per-bucket scale s / norm, 0 for an all-zero bucket (every code is then s: value 0)."""
    return torch.where(norms > 0, levels / norms, torch.zeros_like(norms))


def bucket_scale(flat: Tensor, levels: int, bucket_size: int) -> Tensor:
    """`qsgd_scale(bucket_norms(flat, bucket_size), levels)`."""
    return qsgd_scale(bucket_norms(flat, bucket_size), levels)


def qsgd_codes(flat: Tensor, scale: Tensor, levels: int, bucket_size: int, seed: int) -> Tensor:
    """uint8 offset-binary codes floor(clamp((U + s) + x * scale[bucket], 0, 2s)) (quantize.cu)."""
    n = flat.numel()
    per_element = scale.repeat_interleave(bucket_size)[:n]
    v = counter_uniform(seed, n, flat.device).add_(float(levels))
    v = v.add_(flat * per_element)  # two roundings, as the kernel's __fadd_rn(.., __fmul_rn(..))
    return v.clamp_(0.0, float(2 * levels)).to(torch.uint8)


def terngrad_codes(flat: Tensor, scale: Tensor, seed: int) -> Tensor:
    """Packed 2-bit ternary codes: +1 if x > U*s, -1 if x < -U*s, else 0 (quantize.cu)."""
    thr = counter_uniform(seed, flat.numel(), flat.device).mul_(scale.reshape(1))
    q = (flat > thr).view(torch.int8) - (flat < -thr).view(torch.int8)
    return pack_2bit_torch(ternary_codes(q))


def tbq_step(r: Tensor, g: Tensor, tau: float) -> Tensor:
    """R += g; q = +1 if R >= tau, -1 if R <= -tau, else 0; R -= tau*q in place; packed codes (tbq.cu)."""
    r.add_(g)
    q = (r >= tau).view(torch.int8) - (r <= -tau).view(torch.int8)
    r.sub_(q.to(r.dtype), alpha=tau)
    return pack_2bit_torch(ternary_codes(q))


def nonfinite(x: Tensor) -> Tensor:
    """1-element int32: 1 when an element of `x` is NaN or +-Inf, else 0: the flag a kernel's
    `nonfinite` argument receives (dragonn_select, block_absmax, compensate_select: of its `g`), as
    an extra pass (an oracle's)."""
    return (~torch.isfinite(x)).any().to(torch.int32).reshape(1)
