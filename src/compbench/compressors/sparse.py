"""Shared machinery of the sparsifiers (topk, randk, dgc, dragonn, graddrop).

Wire format of a sparse payload: `[values, indices]`, values fp32 (dgc may send fp16), indices int32.
Decoding zero-fills and scatter-ADDS (`index_add_`), so duplicate indices add up; the fused
`sparse_decode_all` concatenates every rank's (values, indices), does ONE `index_add_` and divides by N.
That is DRAGONN's `--batching` done right: the reference overwrites duplicates and forgets the 1/N.

CPU speed notes (n = 25M, one thread): `numpy.flatnonzero` on a bool mask is ~5x faster than
`torch.nonzero` and `numpy.greater_equal` ~2x faster than `torch.ge`; `index_select` is ~4x faster
than `x[idx]`; a fresh 100 MB tensor costs 30-40 ms of page faults (more than the arithmetic), so
scratch lives in a `Workspace`; `AbsIndex` finds the few elements above a threshold from per-block
maxima (see there); a sampled threshold plus `topk` among the candidates is ~25x faster than
`torch.topk` over the whole tensor. CUDA tensors take the kernels of `compbench.kernels` when CuPy is
installed, else the same torch expressions as before.

Host synchronization on a GPU: a selection by threshold (topk's candidates, DGC, DRAGONN, graddrop)
reads how many elements it selected, once per tensor (the payload's size, which the uneven allgather
needs); rand-k's indices are a host draw copied to the device. Nothing else in here waits for the GPU.

Decode into a caller's buffer: `sparse_decode(..., out=buf)` and `sparse_decode_all(..., out=buf)`
zero-fill and scatter into `buf` instead of a fresh tensor (aliasing rule: `buffers.py`).
"""

from __future__ import annotations

import math
import zlib
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from compbench.codec.base import ERROR_FEEDBACK_RECIPE, Capabilities, CompressorBase, Ctx, num_selected
from compbench.codec.buffers import acc_dtype, check_out
from compbench.codec.finite import FiniteCheck, flag
from compbench.kernels import cpu, cpu_kernels_enabled, cuda_kernels_enabled

if TYPE_CHECKING:
    from compbench.codec.deferred import Deferred

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

    Compression runs on one thread, tensor after tensor, so one buffer per (dtype, device, tag) sized
    for the largest tensor seen is enough. Callers must not keep views of it past the call.
    """

    def __init__(self) -> None:
        self._bufs: dict[tuple[torch.dtype, torch.device, str], Tensor] = {}

    def get(self, n: int, dtype: torch.dtype, device: torch.device | str, tag: str = "") -> Tensor:
        key = (dtype, torch.device(device), tag)
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
    """Indices (int64, ascending) where `mag >= threshold`, one pass, mask in a reused buffer."""
    mask = ws.get(mag.numel(), torch.bool, mag.device)
    if mag.device.type == "cpu" and mag.dtype == torch.float32 and mag.is_contiguous():
        np.greater_equal(mag.numpy(), _as_float32(threshold), out=mask.numpy())
    else:
        torch.ge(mag, threshold, out=mask)
    return nonzero_1d(mask)


def _as_float32(t: float | Tensor) -> np.float32:
    """A threshold as a numpy fp32 scalar (the tensors compared against it are fp32)."""
    return np.float32(t.item() if isinstance(t, Tensor) else t)


# Up to this many elements AbsIndex compares directly (fresh small arrays are cheap).
_SMALL = 16384
# Elements per block of AbsIndex's summary: 4 cache lines, so re-reading a candidate block is cheap,
# and torch's row reductions over 64-wide rows run at memory speed (16-wide rows are 6x slower).
_BLOCK = 64


class AbsIndex:
    """`indices where abs(x) >= t` for a flat tensor `x`, for one or several thresholds t.

    The compaction every sparsifier needs. On CPU, for sparse selections (the expected fraction
    `density` of elements passing below ~0.5%), one summary pass computes the largest magnitude of
    each block of 64 contiguous elements (the compiled `block_absmax`, one read pass; its twin
    `amax` and `amin` row reductions take ~2.5 at n = 25M; nothing written but n/64 floats); a
    query then re-reads only the blocks whose maximum reaches t (~64 * density of them) and compacts
    inside them. A second threshold (the exact top-k's retries) costs almost
    nothing. Dense selections, small tensors and other dtypes take one abs + compare +
    `flatnonzero` pass per query instead. CUDA tensors take the
    compaction kernel when CuPy is installed, else `torch.nonzero`.

    NaN elements never pass (`NaN >= t` is false), as in the plain comparison; the twin's summary of
    a block holding a NaN is NaN and the block is always re-read, so a NaN cannot hide a passing
    element beside it (the kernel's maxima skip NaN elements instead).

    `summary`: the block maxima of x when already computed (`codec.deferred.Deferred.summary`, the
    same array as `kernels.cpu.block_absmax(x)`), so the summary pass is not run again.

    `check`: the trainer's non-finite check of x, done by the compiled summary pass when it runs
    (codec/finite.py); taken by nothing else.
    """

    def __init__(self, x: Tensor, ws: Workspace, density: float = 0.0, summary: Tensor | None = None,
                 check: FiniteCheck | None = None) -> None:
        self.flat = x.detach().reshape(-1)
        self.ws = ws
        self.density = float(density)
        n = self.flat.numel()
        self._blocks = self.takes_summary(self.flat, density)
        self._mag: Tensor | None = None
        # Small CPU tensors: plain numpy on the tensor itself, no scratch bookkeeping (per-call cost).
        self._small = (
            not self._blocks
            and self.flat.device.type == "cpu"
            and self.flat.dtype == torch.float32
            and self.flat.is_contiguous()
            and n <= _SMALL
        )
        if self._blocks:
            nb = n // _BLOCK
            rows = self.flat[: nb * _BLOCK].view(nb, _BLOCK)
            self._rows = rows.numpy()
            self._tail = self.flat[nb * _BLOCK :].numpy()
            if summary is None:
                summary = torch.from_numpy(self._block_maxima(rows, check))
            self._summary = summary
            self._bmax = self._summary.numpy()

    @staticmethod
    def takes_summary(flat: Tensor, density: float) -> bool:
        """Whether queries on flat `flat` at this density go through the block maxima (a summary
        given to the constructor is used; otherwise each query compares every element)."""
        return (flat.device.type == "cpu" and flat.dtype == torch.float32 and flat.is_contiguous()
                and flat.numel() >= 16 * _BLOCK and float(density) * _BLOCK < 0.3)

    def _block_maxima(self, rows: Tensor, check: FiniteCheck | None) -> np.ndarray:
        if cpu_kernels_enabled(self.flat):  # one read pass; NaN-free maxima select the same blocks
            return cpu.block_absmax(self.flat, nonfinite=flag(check, self.flat.device)).numpy()
        hi = self.ws.get(rows.shape[0], torch.float32, "cpu", "blockmax")
        lo = self.ws.get(rows.shape[0], torch.float32, "cpu", "blockmin")
        torch.amax(rows, dim=1, out=hi)
        torch.amin(rows, dim=1, out=lo)
        return np.maximum(hi.numpy(), np.negative(lo.numpy(), out=lo.numpy()), out=hi.numpy())

    def indices_ge(self, threshold: float | Tensor) -> Tensor:
        """Flat indices (int64, ascending on CPU) of the elements with abs(x) >= threshold."""
        if self._blocks:
            t = _as_float32(threshold)
            if cpu_kernels_enabled(self.flat):  # the same query, compiled: no scratch copies of blocks
                return cpu.blocks_abs_ge(self.flat, self._summary, float(t))
            blk = np.flatnonzero(~(self._bmax < t))  # NaN summaries are re-read
            if 4 * blk.size > self._bmax.size:
                # Far denser than announced (ties, a flat tensor): one plain pass is cheaper.
                return self._plain(threshold)
            # Reused scratch: a fresh multi-MB array per query costs page faults.
            size = blk.size * _BLOCK
            sub = self.ws.get(size, torch.float32, "cpu", "blocks").numpy().reshape(blk.size, _BLOCK)
            hit_mask = self.ws.get(size, torch.bool, "cpu", "blocks").numpy().reshape(blk.size, _BLOCK)
            np.take(self._rows, blk, axis=0, out=sub)
            np.greater_equal(np.abs(sub, out=sub), t, out=hit_mask)
            hit = np.flatnonzero(hit_mask)
            idx = blk[hit // _BLOCK] * _BLOCK + hit % _BLOCK
            tail = np.flatnonzero(np.abs(self._tail) >= t)
            if tail.size:
                idx = np.concatenate((idx, tail + self._rows.size))
            return torch.from_numpy(idx)
        if self._small:
            return torch.from_numpy(np.flatnonzero(np.abs(self.flat.numpy()) >= _as_float32(threshold)))
        if self.flat.is_cuda and cuda_kernels_enabled(self.flat):
            from compbench.kernels import ops

            # Room for twice the announced density: one launch in the usual case.
            capacity = int(2 * self.density * self.flat.numel()) + 1024 if self.density > 0 else None
            return ops.compact_abs_ge(self.flat, float(_as_float32(threshold)), capacity).sort().values
        return self._plain(threshold)

    def _plain(self, threshold: float | Tensor) -> Tensor:
        if self._mag is None:
            self._mag = magnitudes(self.flat, self.ws)
        return indices_ge(self._mag, threshold, self.ws)


def kth_largest(samples: Tensor, j: int) -> Tensor:
    """The smallest of the top `j` values of `samples` (1-element tensor), without a full sort."""
    m = samples.numel()
    j = min(max(j, 1), m)
    if samples.device.type == "cpu" and samples.dtype == torch.float32:
        # Introselect: ~2x faster than torch.topk on 250k samples.
        return torch.from_numpy(np.partition(samples.contiguous().numpy(), m - j)[m - j : m - j + 1])
    return torch.topk(samples, j, sorted=False).values.min().reshape(1)


def topk_among(values: Tensor, candidates: Tensor, k: int) -> Tensor:
    """The `k` candidates of largest magnitude abs(values) (all of them when there are at most k)."""
    if candidates.numel() <= k:
        return candidates
    mag = values.index_select(0, candidates).abs()
    return candidates.index_select(0, torch.topk(mag, k, sorted=False).indices)


def exact_topk_indices(values: Tensor | None, k: int, ws: Workspace,
                       deferred: Deferred | None = None, check: FiniteCheck | None = None) -> Tensor:
    """Exact top-k of abs(values) (ties broken arbitrarily), ~25x faster than `torch.topk` at n = 25M
    on CPU.

    A strided sample gives a threshold expected to pass ~2k elements; if at least k pass, the top-k of
    the whole tensor are all among them (every non-candidate is below every candidate), so the top-k
    of the candidates IS the exact top-k. Otherwise the threshold is lowered (cheap: `AbsIndex` keeps
    its summary); last resort full topk.

    `deferred` (then `values` is None): a memory's compensation, run as the summary pass.
    `check`: the trainer's non-finite check of the gradient, taken by that summary pass where it is a
    compiled kernel (codec/finite.py).
    """
    flat: Tensor | None = None
    if deferred is not None:
        n = deferred.numel
        if k >= n or n <= 65536 or 8 * k > n or deferred.device.type != "cpu":
            return exact_topk_indices(deferred.apply(), k, ws)  # a GPU's topk reads the result
    else:
        assert values is not None, "exact_topk_indices: values, or a deferred compensation"
        flat = values.detach().reshape(-1)
        n = flat.numel()
    if flat is not None and k >= n:
        return torch.arange(n, device=flat.device)
    if flat is not None and (flat.device.type != "cpu" or n <= 65536 or 8 * k > n):
        # torch.topk is fast on GPU (radix select) and for small or dense cases.
        return torch.topk(flat.abs(), k, sorted=False).indices
    stride = max(1, n // max(math.ceil(0.01 * n), math.ceil(64 * n / k)))
    summary = None
    if deferred is not None:
        y, summary = deferred.summary(check=check)
        flat = y.reshape(-1)
    assert flat is not None
    samples = flat[::stride].abs()
    m = samples.numel()
    j = math.ceil(2.0 * k * m / n) + 4
    index = AbsIndex(flat, ws, density=2.0 * k / n, summary=summary, check=check)
    while j < m:
        cand = index.indices_ge(kth_largest(samples, j))
        if cand.numel() >= k:
            return topk_among(flat, cand, k)
        j *= 4
    return torch.topk(flat.abs(), k, sorted=False).indices


def sparse_payload(values: Tensor, indices: Tensor, value_dtype: torch.dtype = torch.float32) -> list[Tensor]:
    """The wire format: [values (fp32 unless told), indices int32], both 1-D and contiguous."""
    return [values.reshape(-1).to(value_dtype).contiguous(), indices.reshape(-1).to(torch.int32).contiguous()]


def decode_buffer(ctx: Ctx, device: torch.device | str, out: Tensor | None) -> Tensor:
    """`out` zero-filled (checked by `buffers.check_out`), else fresh zeros."""
    if out is None:
        return torch.zeros(ctx.numel, dtype=acc_dtype(ctx.dtype), device=device)
    return check_out(out, ctx, device).zero_()


def scatter_add(out: Tensor, indices: Tensor, values: Tensor) -> Tensor:
    """out[indices] += values (duplicates add): the CUDA kernel when available, else `index_add_`."""
    if out.is_cuda and cuda_kernels_enabled(out):
        from compbench.kernels import ops

        return ops.scatter_add(out, indices, values)
    return out.index_add_(0, indices, values)


def sparse_decode(payload: list[Tensor], ctx: Ctx, out: Tensor | None = None) -> Tensor:
    """Zero-fill and scatter-ADD one payload (duplicate indices add); into `out` when given."""
    values, indices = payload[0], payload[1]
    buf = decode_buffer(ctx, values.device, out)
    scatter_add(buf, indices, values.to(buf.dtype))
    return buf.to(ctx.dtype).view(ctx.shape)


def sparse_decode_all(payloads: list[list[Tensor]], ctx: Ctx, out: Tensor | None = None) -> Tensor:
    """Average of all ranks' sparse payloads with ONE scatter-add: duplicates add, then divide by N.
    Into `out` when given (see the module docstring)."""
    acc = acc_dtype(ctx.dtype)
    # Divide the few sent values rather than the dense result: one pass over n saved.
    values = torch.cat([p[0].to(acc) for p in payloads]).div_(len(payloads))
    indices = torch.cat([p[1] for p in payloads])
    buf = decode_buffer(ctx, values.device, out)
    scatter_add(buf, indices, values)
    return buf.to(ctx.dtype).view(ctx.shape)


def sparse_average(payloads: list[list[Tensor]], ctx: Ctx) -> Tensor:
    """`sparse_decode_all` without the dense buffer: a coalesced COO tensor of ctx.shape (sorted
    unique indices; duplicates summed in payload order, as the dense scatter-add does)."""
    acc = acc_dtype(ctx.dtype)
    values = torch.cat([p[0].to(acc) for p in payloads]).div_(len(payloads))
    if cpu_kernels_enabled(values) and ctx.numel < 2**32:  # one sort by radix, sums and coordinates
        coords, sums = cpu.sparse_average(torch.cat([p[1] for p in payloads]), values, tuple(ctx.shape))
        return torch.sparse_coo_tensor(coords, sums.to(ctx.dtype), ctx.shape, is_coalesced=True,
                                       check_invariants=False)
    indices = torch.cat([p[1] for p in payloads]).long()
    unique, inverse = torch.unique(indices, sorted=True, return_inverse=True)
    sums = torch.zeros(unique.numel(), dtype=acc, device=values.device).index_add_(0, inverse, values)
    coords = torch.stack(torch.unravel_index(unique, ctx.shape)) if len(ctx.shape) > 1 else unique.view(1, -1)
    # Built from sorted unique indices: coalesced by construction, nothing to check.
    return torch.sparse_coo_tensor(coords, sums.to(ctx.dtype), ctx.shape, is_coalesced=True,
                                   check_invariants=False)


class Sparsifier(CompressorBase):
    """Base of the sparsifiers that select k = ceil(n * ratio) elements: ratio and workspace."""

    ratio: float = 0.01

    def __init__(self) -> None:
        self._ws = Workspace()

    def k_for(self, numel: int) -> int:
        """Number of elements to send for a tensor of `numel` elements at the current ratio."""
        return min(numel, num_selected(numel, self.ratio))


class SparseCompressor(Sparsifier):
    """Base of the [values, indices] sparsifiers: decode, fused decode, sparse average, sent indices."""

    caps = Capabilities(sparse=True, decodes_into=True, sparse_average=True, recipe=ERROR_FEEDBACK_RECIPE,
                        why_not_summable="sends rank-dependent indices")

    def decompress(self, payload: list[Tensor], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        """Dense decode; into the caller's buffer `out` when given (see `decode_buffer`)."""
        return sparse_decode(payload, ctx, out)

    def decompress_all(self, payloads: list[list[Tensor]], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        """Average of every rank's decode with one scatter-add; into `out` when given."""
        return sparse_decode_all(payloads, ctx, out)

    def decompress_all_sparse(self, payloads: list[list[Tensor]], ctx: Ctx) -> Tensor:
        """The average of every rank's payload as what it is, sparse: a coalesced COO tensor of
        ctx.shape, the optimizer's input without a dense decode (`optim.optimizers.SGD`). Its values are
        `decompress_all`'s at the indices it carries, bit for bit: the same division, and the sums
        taken by the same sequential `index_add_` in the same order; every other element is 0."""
        return sparse_average(payloads, ctx)

    def sent_indices(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        """Flat indices this payload carries (memory=dgc masks its momentum there)."""
        return payload[1].long()

    def sparse_entries(self, payload: list[Tensor], ctx: Ctx) -> tuple[Tensor, Tensor]:
        """(flat indices, values): the decode is zeros with the values added at the indices, so an
        error-feedback memory can take it away from its residual in O(k) (`memory=residual`)."""
        return payload[1].long(), payload[0]
