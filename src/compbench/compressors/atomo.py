"""`atomo`: ATOMO (Wang et al., NeurIPS 2018) on the singular-value atoms of the gradient matrix."""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import Tensor

from compbench.codec.base import Capabilities, CompressorBase, Ctx, make_ctx
from compbench.compressors.lowrank import (
    cpu_generator,
    dense_payload,
    matrix_shape,
    process_rank,
    stable_seed,
)
from compbench.engines.device import host_to


def atomo_probabilities(sigma: Tensor, budget: float, rtol: float = 0.0) -> Tensor:
    """Keep-probabilities p_i = min(1, c * sigma_i) with c chosen so that sum(p) = min(budget, rank).

    `sigma` holds singular values in descending order. The paper's rule p_i = min(1, s*sigma_i/sum)
    loses budget whenever an atom clips at 1, so this water-fills: with the k largest atoms clipped,
    c = (s - k) / sum(sigma[k:]); the right k is the smallest with c * sigma[k] <= 1 (then every
    clipped atom has c * sigma_i > 1 too). The expected number of atoms is then exactly s. Values at
    most rtol * sigma_max count as numerically zero (the matrix_rank convention): they get p = 0 and
    `rank` counts only the others. Computed in float64 on the host (the vector is short).
    """
    sigma = sigma.detach().to("cpu", torch.float64)
    p = torch.zeros_like(sigma)
    if sigma.numel() == 0 or not sigma[0] > 0:
        return p
    rank = int((sigma > rtol * sigma[0]).sum())
    if budget >= rank:
        p[:rank] = 1.0
        return p
    s = sigma[:rank]
    tail = s.flip(0).cumsum(0).flip(0)  # tail[k] = sum(s[k:])
    k = torch.arange(rank, dtype=torch.float64, device="cpu")
    c = (budget - k) / tail
    # Exists and is < budget (at k = ceil(budget) - 1, c * s[k] <= s[k] / tail[k] <= 1).
    first = int(torch.nonzero(c * s <= 1.0 + 1e-12)[0])
    p[:first] = 1.0
    p[first:rank] = (c[first] * s[first:]).clamp_(max=1.0)
    return p


def _atomo_encode(mat: Tensor, budget: float, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """The hot step: SVD, draw atoms with `atomo_probabilities`, return (U_kept, Vh_kept, sigma/p)."""
    u, sigma, vh = torch.linalg.svd(mat, full_matrices=False)
    rtol = max(mat.shape) * torch.finfo(mat.dtype).eps
    p = atomo_probabilities(sigma, budget, rtol)
    # Uniforms in [0, 1): p = 0 is never kept and p = 1 always is.
    keep = torch.nonzero(torch.rand(p.shape, generator=gen, dtype=torch.float64, device="cpu") < p).flatten()
    scaled = (sigma.detach().to("cpu", torch.float64)[keep] / p[keep]).to(mat.dtype)
    idx = host_to(keep, mat.device)  # the host's draw, queued on the stream (pinned): no second wait
    return u.index_select(1, idx), vh.index_select(0, idx), host_to(scaled, mat.device)


@lru_cache(maxsize=1024)
def _max_elements(numel: int) -> int:
    """Most fp32 values any shape with `numel` elements can put on the wire: dense n, or every atom of
    an r x c matrix (r * c = n), min(r, c) * (r + c + 1), largest for the most square factorisation."""
    best = numel
    for d in range(1, math.isqrt(numel) + 1):
        if numel % d == 0:
            best = max(best, d * (numel // d + d + 1))
    return best


class Atomo(CompressorBase):
    """ATOMO on the SVD atoms of the gradient reshaped to (out, rest): unbiased, ~`svd_rank` atoms.

    The SVD M = sum_i sigma_i u_i v_i^T is sparsified atom by atom: atom i is kept with probability
    p_i = min(1, c * sigma_i) (see `atomo_probabilities`; expected atom count = min(svd_rank, rank))
    and its sigma_i is sent divided by p_i, so E[decode] = M. `svd_rank` (the budget s, default 3,
    one of the ranks the paper evaluates) may be fractional. Wire, per kept atom 4*(rows+cols+1)
    bytes: [U_kept (rows x m) row-major, V_kept^T (m x cols) row-major, sigma_i/p_i (m)], where m =
    len(sigma) differs between ranks and steps. Dense fp32 (4n) for 1-D tensors and for matrices
    whose *expected* atoms would not be smaller than dense (svd_rank*(rows+cols+1) >= rows*cols); that
    choice depends on the shape only, so it stays unbiased and every rank decodes every payload alike.

    Random draws: a CPU generator seeded by (seed, step, tensor name, process rank), the rank read from
    env RANK or HOROVOD_RANK (default 0): runs are reproducible and ranks draw independently (their
    estimates' errors then average out over N ranks instead of adding up coherently).

    The atoms are drawn on the host, from the singular values read there: on a GPU one host
    synchronization per tensor (how many atoms are sent is the payload's size).

    Where compbench deliberately differs from the reference code (hwang595/ATOMO):
    - the reference clips p_i at 1 without redistributing the lost budget (fewer atoms than s in
      expectation, more variance); compbench water-fills so that the expectation is exactly s;
    - the reference redraws when no atom was drawn, which biases the estimate; compbench sends zero
      atoms then (an empty payload decodes to zeros) and stays unbiased;
    - the reference reshapes 1-D tensors to (n//2, 2), dropping the last element of odd n, and 4-D
      tensors to (a*b/2, 2*c); compbench sends 1-D tensors dense and uses (out, in*kh*kw);
    - numerically-zero singular values (<= max(rows, cols) * eps * sigma_max) get p = 0: otherwise
      rounding noise would be amplified by 1/p_i.
    """

    name = "atomo"
    caps = Capabilities(unbiased=True, min_dims=2)

    def __init__(self, svd_rank: float = 3, seed: int = 0) -> None:
        if isinstance(svd_rank, bool) or not isinstance(svd_rank, (int, float)) or not svd_rank > 0:
            raise ValueError(
                f"compressor=atomo: svd_rank={svd_rank} must be a positive number (the expected number of "
                "atoms sent); pass e.g. svd_rank=3"
            )
        self.svd_rank = float(svd_rank)
        self.seed = int(seed)

    def _dense(self, rows: int, cols: int) -> bool:
        return self.svd_rank * (rows + cols + 1) >= rows * cols

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        rc = matrix_shape(x.shape)
        if rc is None or self._dense(*rc):
            return dense_payload(x), make_ctx(x, name, matrix=None)
        gen = cpu_generator(stable_seed("atomo", self.seed, self.step, name, process_rank()))
        u, vh, scaled = _atomo_encode(x.detach().reshape(rc).to(torch.float32), self.svd_rank, gen)
        return [u.reshape(-1), vh.reshape(-1), scaled], make_ctx(x, name, matrix=rc)

    def decompress(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        rc = ctx.meta["matrix"]
        if rc is None:
            return payload[0].view(ctx.shape).to(ctx.dtype)
        rows, cols = rc
        u, vh, scaled = payload
        m = scaled.numel()
        return ((u.view(rows, m) * scaled) @ vh.view(m, cols)).view(ctx.shape).to(ctx.dtype)

    def decompress_all(self, payloads: list[list[Tensor]], ctx: Ctx) -> Tensor:
        """All ranks' atoms side by side, one matmul: sum_r U_r S_r Vh_r = [U_1 S_1 ..] [Vh_1; ..]."""
        rc = ctx.meta["matrix"]
        if rc is None:
            return super().decompress_all(payloads, ctx)
        rows, cols = rc
        us = torch.cat([u.view(rows, s.numel()) * s for u, _, s in payloads], dim=1)
        vhs = torch.cat([vh.view(s.numel(), cols) for _, vh, s in payloads], dim=0)
        return (us @ vhs).div_(len(payloads)).view(ctx.shape).to(ctx.dtype)

    def wire_bytes(self, numel: int) -> int | None:
        return None  # the number of kept atoms is random

    def max_wire_bytes(self, numel: int) -> int:
        """Bound over every shape of `numel` elements: all min(r, c) atoms of the squarest r x c."""
        return 4 * _max_elements(numel)

    def payload_bytes(self, shape: torch.Size | tuple[int, ...], atoms: int) -> int:
        """Exact bytes for a tensor of `shape` when `atoms` atoms were kept (dense tensors: 4n)."""
        rc = matrix_shape(shape)
        if rc is None or self._dense(*rc):
            return 4 * math.prod(shape)
        return 4 * atoms * (rc[0] + rc[1] + 1)
