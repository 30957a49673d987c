"""`residual`: classic error feedback, x = beta * residual + gamma * g; residual = x - decode(encode(x)).
A synchronization mode may scale g by a schedule on top (`scale_input`: sync=demo's learning rate).

MergeComp's published residual memory decays the error by 0.9; compbench defaults to beta = gamma = 1
(plain error feedback, as in EF-SGD) and lets a user choose otherwise.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from compbench.base.values import KeyRange
from compbench.codec.base import Compressor, Ctx, is_sparse
from compbench.codec.deferred import Deferred
from compbench.kernels.cpu import RESIDUAL
from compbench.memory.base import NO_STATE, MemoryTraits, fusable


class ResidualMemory:
    """Error feedback with configurable decay `beta` and gradient scale `gamma`.

    The residual is kept in place: `compensate` adds the gradient into the memory's own buffer and
    returns it (compressors must not modify their input), and `update` takes the decode away from
    it, for a sparsifier in O(k) (`sparse_entries`: the decode is zeros plus k values) instead of a
    dense decode and a subtraction over n elements. With a compressor that fuses the memory
    (`Capabilities.fuses_memory`: dgc, topk, dragonn) `defer` hands the compensation to its selection
    pass: one compiled pass over the gradient and the residual (same bytes as `compensate`).
    """

    KEY_RANGES: ClassVar[dict[str, KeyRange]] = {
        "beta": KeyRange(0, integer=False, what="the weight of the kept residual"),
        "gamma": KeyRange(0, integer=False, what="the weight of what the compressor dropped")}

    traits = MemoryTraits(feeds_back=True, state_passes=2)  # its residual, read and written

    def __init__(self, beta: float = 1.0, gamma: float = 1.0) -> None:
        self.beta = float(beta)
        self.gamma = float(gamma)
        self.factor = 1.0  # `scale_input`'s
        self.residuals: dict[str, Tensor] = {}

    def scale_input(self, factor: float) -> None:
        """g is scaled by gamma * factor from now on (`memory.base.ScalesInput`)."""
        self.factor = float(factor)

    @property
    def scale(self) -> float:
        return self.gamma * self.factor

    def compensate(self, g: Tensor, name: str) -> Tensor:
        r = self.residuals.get(name)
        if r is None or r.shape != g.shape:
            # The memory's own contiguous buffer: g is the user's .grad and is never modified.
            r = torch.empty(g.shape, dtype=g.dtype, device=g.device)
            self.residuals[name] = torch.mul(g, self.scale, out=r)
            return r
        if self.beta != 1.0:
            r.mul_(self.beta)
        return r.add_(g, alpha=self.scale)

    def defer(self, g: Tensor, name: str) -> Deferred | None:
        """`compensate` as one pass with the compressor's selection (`codec.deferred.Deferred`)."""
        r = self.residuals.get(name)
        if r is None or r.shape != g.shape or not fusable(r, g):
            return None
        return Deferred(r.view(-1), NO_STATE, g, RESIDUAL, self.beta, self.scale, 1.0, out=r)

    def update(self, x: Tensor, name: str, compressor: Compressor, payload: list[Tensor], ctx: Ctx) -> None:
        r = self.residuals[name]
        if any(t.untyped_storage().data_ptr() == r.untyped_storage().data_ptr() for t in payload):
            r = self.residuals[name] = r.clone()  # a payload viewing the buffer must stay intact until sent
        if x.data_ptr() != r.data_ptr():
            r.copy_(x)  # what was compressed is not the buffer itself (a ring hop added a partial sum)
        if is_sparse(compressor):
            indices, values = compressor.sparse_entries(payload, ctx)
            r.view(-1).index_add_(0, indices, values.to(r.dtype), alpha=-1)
        else:
            r.sub_(compressor.decompress(payload, ctx))

    def state_dict(self) -> dict:
        return {"residuals": {k: v.clone() for k, v in self.residuals.items()}}

    def load_state_dict(self, d: dict) -> None:
        self.residuals = {k: v.clone() for k, v in d.get("residuals", {}).items()}
