"""`topk`: the k = ceil(n*r) entries of largest magnitude, sent as [values fp32, indices int32]: 8k bytes."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from torch import Tensor

from compbench.codec.base import Ctx, check_ratio, make_ctx
from compbench.codec.finite import FiniteCheck
from compbench.compressors.sparse import (
    SparseCompressor,
    Workspace,
    exact_topk_indices,
    sparse_payload,
)

if TYPE_CHECKING:
    from compbench.codec.deferred import Deferred


def _select(x: Tensor, k: int, ws: Workspace, check: FiniteCheck | None = None) -> Tensor:
    """Hot step: flat int64 indices of the exact top-k of abs(x) (`check`: codec/finite.py's, taken
    by the compiled summary pass where it runs)."""
    return exact_topk_indices(x.detach().reshape(-1), k, ws, check=check)  # it thresholds magnitudes itself


class TopK(SparseCompressor):
    """Exact top-k by magnitude (biased: pair it with memory=residual).

    Selection is exact (ties broken arbitrarily) but avoids `torch.topk` over the whole tensor on CPU:
    a sampled threshold keeps ~2k candidates and the top-k is taken among them (see
    `sparse.exact_topk_indices` for why that is still the exact top-k).
    """

    name = "topk"
    caps = replace(SparseCompressor.caps, fuses_memory=True)

    def __init__(self, ratio: float = 0.01) -> None:
        super().__init__()
        self.ratio = check_ratio(ratio, "compressor=topk")

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        flat = x.detach().reshape(-1)
        idx = _select(flat, self.k_for(flat.numel()), self._ws, self.finite.check(name, flat.numel()))
        return sparse_payload(flat[idx], idx), make_ctx(x, name)

    def wire_bytes(self, numel: int) -> int:
        return 8 * self.k_for(numel)

    def compress_deferred(self, deferred: Deferred, name: str) -> tuple[list[Tensor], Ctx]:
        """`compress` of a memory's compensation, run inside the selection's summary pass."""
        idx = exact_topk_indices(None, self.k_for(deferred.numel), self._ws, deferred=deferred,
                                 check=self.finite.check(name, deferred.numel))
        y = deferred.result
        assert y is not None
        return sparse_payload(y.reshape(-1)[idx], idx), make_ctx(y, name)
