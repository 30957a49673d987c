"""`randk`: k = ceil(n*r) uniformly random entries whose indices every rank draws from the same seed,
so only the values travel (4k bytes) and payloads may be allreduced (summable). The indices are drawn
on the host by a fast sampler (the same on every rank and device) and copied to a GPU: k int64 per
tensor and step (GRACE draws them with randperm on the device, which costs more at large n), from
pinned memory without making the host wait (compress runs inside backward hooks)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from compbench.codec.base import ERROR_FEEDBACK_RECIPE, Capabilities, Ctx, check_ratio, make_ctx
from compbench.compressors.sparse import Sparsifier, make_generator
from compbench.engines.device import host_to


def _draw_indices(n: int, k: int, gen: torch.Generator) -> Tensor:
    """Hot step: a uniformly random k-subset of range(n) (sorted int64 CPU tensor).

    The set of the first k DISTINCT values of an i.i.d. uniform stream is a uniform k-subset (the
    process is invariant under any relabelling of range(n)), so each index is kept with probability
    exactly k/n and scaling by n/k is exactly unbiased. Batches of `k - have` draws can never
    overshoot k distinct values, so batching reproduces the one-by-one stream. Costs ~0.3 ms at
    n = 25M, k = 25k (numpy's SIMD sort) where randperm takes ~1 s; randperm when k is a large
    fraction of n (many repeat draws) or n is small.
    """
    if 4 * k > n or n <= 65536:
        return torch.randperm(n, generator=gen, device="cpu")[:k].sort().values
    u = _sorted_distinct(torch.randint(n, (k,), generator=gen, device="cpu").numpy())
    while u.size < k:
        more = _sorted_distinct(torch.randint(n, (k - u.size,), generator=gen, device="cpu").numpy())
        pos = np.minimum(np.searchsorted(u, more), u.size - 1)
        u = np.sort(np.concatenate((u, more[u[pos] != more])))
    return torch.from_numpy(u)


def _sorted_distinct(a: np.ndarray) -> np.ndarray:
    # np.unique / np.union1d take ~2 ms on 25k int64 here; a SIMD sort plus a mask takes 0.1 ms.
    s = np.sort(a)
    return s[np.concatenate(([True], s[1:] != s[:-1]))]


class RandK(Sparsifier):
    """Random-k sparsification with indices shared by all ranks (seeded by seed, step, tensor name).

    Payload: [values fp32] only; the indices are regenerated from the seed, so they sit in the
    (rank-independent) ctx. `scale=true` multiplies the values by n/k: an exactly unbiased estimate
    (`unbiased` follows it); with the default `scale=false` the compressor is biased and meant for
    memory=residual (Stich et al.'s sparsified SGD with memory), since scaling multiplies the variance
    by n/k (1000x at r = 1e-3).
    """

    name = "randk"
    # lr 0.1, not the error-feedback recipe's 0.3: at 1% a coordinate is sent every ~100 steps, so its
    # residual arrives as one ~100-step-stale update. On the claims' CNN (Fashion-MNIST, 2 workers, seed
    # 0) lr 0.3 blew up at step 64 and ended at chance, and with a 1-epoch warm-up it blew up 54 steps
    # after reaching 0.3 (step 522): the rate itself is too high, not the start. lr 0.1 trains in
    # seeds 0, 1, 2 (docs/results.md, "Recipes that train in every seed").
    caps = Capabilities(summable=True, sparse=True, shared_indices=True,
                        recipe={**ERROR_FEEDBACK_RECIPE, "optim.lr": 0.1})

    def __init__(self, ratio: float = 0.01, scale: bool = False, seed: int = 0) -> None:
        super().__init__()
        self.ratio = check_ratio(ratio, "compressor=randk")
        if not isinstance(seed, int):
            raise ValueError(f"compressor=randk: seed={seed!r} is not an integer; pass e.g. seed=0")
        self.scale = bool(scale)
        self.caps = replace(RandK.caps, unbiased=self.scale)
        self.seed = seed

    def indices(self, numel: int, name: str, device: torch.device | str = "cpu") -> Tensor:
        """The k indices every rank uses for tensor `name` at the current step (drawn on the CPU so
        that CPU and GPU runs agree)."""
        gen = make_generator(self.seed, self.step, name)
        return host_to(_draw_indices(numel, self.k_for(numel), gen), device)

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        flat = x.detach().reshape(-1)
        n = flat.numel()
        idx = self.indices(n, name, flat.device)
        values = flat[idx].to(torch.float32)
        if self.scale:
            values.mul_(n / idx.numel())
        return [values], make_ctx(x, name, indices=idx)

    # Not decodes_into (its decode takes no `out` buffer), nor sparse_average: a Sparsifier, not a
    # SparseCompressor ([values, indices] payloads).
    def decompress(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        out = torch.zeros(ctx.numel, dtype=payload[0].dtype, device=payload[0].device)
        out[ctx.meta["indices"]] = payload[0]
        return out.to(ctx.dtype).view(ctx.shape)

    def decompress_all(self, payloads: list[list[Tensor]], ctx: Ctx) -> Tensor:
        # Same indices on every rank: sum the values, scatter once.
        total = payloads[0][0].clone() if len(payloads) == 1 else torch.stack([p[0] for p in payloads]).sum(0)
        return self.decompress([total.div_(len(payloads))], ctx)

    def sent_indices(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        return ctx.meta["indices"]

    def sparse_entries(self, payload: list[Tensor], ctx: Ctx) -> tuple[Tensor, Tensor]:
        return ctx.meta["indices"], payload[0]

    def wire_bytes(self, numel: int) -> int:
        return 4 * self.k_for(numel)
