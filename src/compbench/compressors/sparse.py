"""Shared machinery of the sparsifiers (topk, randk, dgc, dragonn, graddrop).

Wire format of a sparse payload: `[values, indices]`, values fp32 (dgc may send fp16), indices int32.
Decoding zero-fills and scatter-ADDS (`index_add_`), so duplicate indices add up; the fused
`sparse_decode_all` concatenates every rank's (values, indices), does ONE `index_add_` and divides by N.
That is DRAGONN's `--batching` done right: the reference overwrites duplicates and forgets the 1/N.

CPU speed notes (n = 25M): `numpy.flatnonzero` on a bool mask is ~3x faster than `torch.nonzero`;
`numpy.sort` (SIMD) is ~10x faster than `torch.sort` on 25k int64; a strided or random 1% sample plus
`topk` among the candidates is ~10x faster than `torch.topk` over the whole tensor.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import torch
from torch import Tensor

from compbench.compressors.base import CompressorBase, Ctx, num_selected

_MASK64 = (1 << 64) - 1


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def stable_seed(*parts: int | str) -> int:
    """A 63-bit seed from ints and strings that is the same in every process and run.

    Python's `hash(str)` is salted per process, so names go through zlib.crc32 instead.
    """
    h = 0
    for p in parts:
        v = zlib.crc32(p.encode()) if isinstance(p, str) else int(p) & _MASK64
        h = _splitmix64(h ^ v)
    return h & ((1 << 63) - 1)


def make_generator(*parts: int | str, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded from `stable_seed(*parts)` (e.g. seed, step, tensor name)."""
    return torch.Generator(device=device).manual_seed(stable_seed(*parts))


class Workspace:
    """Per-instance scratch buffers reused across calls (no fresh 100 MB tensor per call at n = 25M).

    Compression runs on one thread, tensor after tensor, so one buffer per (dtype, device) sized for
    the largest tensor seen is enough. Callers must not keep views of it past the call.
    """

    def __init__(self) -> None:
        self._bufs: dict[tuple[torch.dtype, torch.device], Tensor] = {}

    def get(self, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        key = (dtype, torch.device(device))
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < n:
            buf = torch.empty(n, dtype=dtype, device=device)
            self._bufs[key] = buf
        return buf[:n]


def magnitudes(x: Tensor, ws: Workspace) -> Tensor:
    """abs(x) flattened, fp32, written into a reused buffer."""
    flat = x.detach().reshape(-1)
    out = ws.get(flat.numel(), torch.float32, flat.device)
    return torch.abs(flat, out=out) if flat.dtype == torch.float32 else out.copy_(flat).abs_()


def nonzero_1d(mask: Tensor) -> Tensor:
    """Indices (int64) of the True entries of a flat bool mask."""
    if mask.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(mask.numpy()))
    return torch.nonzero(mask).view(-1)


def indices_ge(mag: Tensor, threshold: float | Tensor, ws: Workspace) -> Tensor:
    """Indices (int64) where `mag >= threshold`, one pass, mask in a reused buffer."""
    mask = ws.get(mag.numel(), torch.bool, mag.device)
    torch.ge(mag, threshold, out=mask)
    return nonzero_1d(mask)


def kth_largest(samples: Tensor, j: int) -> Tensor:
    """The smallest of the top `j` values of `samples` (1-element tensor), without a full sort."""
    j = min(max(j, 1), samples.numel())
    return torch.topk(samples, j, sorted=False).values.min().reshape(1)


def topk_among(mag: Tensor, candidates: Tensor, k: int) -> Tensor:
    """The `k` candidates of largest magnitude (all of them when there are at most k)."""
    if candidates.numel() <= k:
        return candidates
    return candidates[torch.topk(mag[candidates], k, sorted=False).indices]


def exact_topk_indices(mag: Tensor, k: int, ws: Workspace) -> Tensor:
    """Exact top-k of `mag` (ties broken arbitrarily), ~10x faster than `torch.topk` at n = 25M on CPU.

    A strided sample gives a threshold expected to pass ~2k elements; if at least k pass, the top-k of
    the whole tensor are all among them (every non-candidate is below every candidate), so the top-k
    of the candidates IS the exact top-k. Otherwise the threshold is lowered; last resort full topk.
    """
    n = mag.numel()
    if k >= n:
        return torch.arange(n, device=mag.device)
    if mag.device.type != "cpu" or n <= 65536 or 8 * k > n:
        # torch.topk is fast on GPU (radix select) and for small or dense cases.
        return torch.topk(mag, k, sorted=False).indices
    stride = max(1, n // max(math.ceil(0.01 * n), math.ceil(64 * n / k)))
    samples = mag[::stride]
    m = samples.numel()
    j = math.ceil(2.0 * k * m / n) + 4
    while j < m:
        cand = indices_ge(mag, kth_largest(samples, j), ws)
        if cand.numel() >= k:
            return topk_among(mag, cand, k)
        j *= 4
    return torch.topk(mag, k, sorted=False).indices


def sparse_payload(values: Tensor, indices: Tensor, value_dtype: torch.dtype = torch.float32) -> list[Tensor]:
    """The wire format: [values (fp32 unless told), indices int32], both 1-D and contiguous."""
    return [values.reshape(-1).to(value_dtype).contiguous(), indices.reshape(-1).to(torch.int32).contiguous()]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half-precision gradients are accumulated in fp32 so that N ranks' sums do not lose bits.
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def sparse_decode(payload: list[Tensor], ctx: Ctx) -> Tensor:
    """Zero-fill and scatter-ADD one payload (duplicate indices add)."""
    values, indices = payload[0], payload[1]
    acc = _acc_dtype(ctx.dtype)
    out = torch.zeros(ctx.numel, dtype=acc, device=values.device)
    out.index_add_(0, indices, values.to(acc))
    return out.to(ctx.dtype).view(ctx.shape)


def sparse_decode_all(payloads: list[list[Tensor]], ctx: Ctx) -> Tensor:
    """Average of all ranks' sparse payloads with ONE scatter-add: duplicates add, then divide by N."""
    acc = _acc_dtype(ctx.dtype)
    # Divide the few sent values rather than the dense result: one pass over n saved.
    values = torch.cat([p[0].to(acc) for p in payloads]).div_(len(payloads))
    indices = torch.cat([p[1] for p in payloads])
    out = torch.zeros(ctx.numel, dtype=acc, device=values.device)
    out.index_add_(0, indices, values)
    return out.to(ctx.dtype).view(ctx.shape)


class SparseCompressor(CompressorBase):
    """Base of the [values, indices] sparsifiers: decode, fused decode, sent indices, workspace."""

    summable = False
    why_not_summable = "sends rank-dependent indices"
    ratio: float = 0.01

    def __init__(self) -> None:
        self._ws = Workspace()

    def k_for(self, numel: int) -> int:
        """Number of elements to send for a tensor of `numel` elements at the current ratio."""
        return min(numel, num_selected(numel, self.ratio))

    def decompress(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        return sparse_decode(payload, ctx)

    def decompress_all(self, payloads: list[list[Tensor]], ctx: Ctx) -> Tensor:
        return sparse_decode_all(payloads, ctx)

    def sent_indices(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        """Flat indices this payload carries (memory=dgc masks its momentum there)."""
        return payload[1].long()
