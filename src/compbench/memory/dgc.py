"""`dgc`: Deep Gradient Compression's memory: momentum correction, factor masking, local clipping."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from compbench.codec.base import Compressor, Ctx, is_sparse
from compbench.codec.deferred import Deferred
from compbench.kernels.cpu import DGC, DGC_NESTEROV
from compbench.memory.base import MemoryTraits, fusable


class DGCMemory:
    """Momentum correction (Lin et al., ICLR 2018), per tensor name:

        u = m*u + g;        v = v + u          (nesterov=false)
        u = (u + g)*m;      v = v + u + g      (nesterov=true)

    `compensate` returns v (the memory's own buffer; compressors must not modify it), which is what
    gets compressed. `update` applies momentum factor masking: u (if `momentum_masking`) and v are
    zeroed at the SENT indices, taken from the compressor's `sent_indices` (a sparsifier's: the
    memory declares `needs_sparse`). Invariant: after update, v keeps its value at every
    unsent entry and is 0 at every sent one.

    Optional local gradient clipping (`gradient_clipping` = max norm): each gradient is clipped to
    norm gradient_clipping / sqrt(world_size) before it is accumulated (`world_size` is filled in by
    the trainer).

    With a compressor that fuses the memory (`Capabilities.fuses_memory`: dgc, topk, dragonn)
    `defer` hands the compensation to its selection pass: one compiled pass over g, u and v that
    updates them exactly as `compensate` does (same bytes).

    `traits.owns_momentum`: momentum is applied here, so the trainer gives the tensors this memory
    sees DGC's SGD (`compbench.optim.optimizers.SGD`'s `dgc` group: no momentum on the gradient, momentum
    on the weight-decay term only; optim=sgd's momentum, weight_decay and nesterov). The trainer sends
    1-D and uncompressed tensors past the memory (dense, with the optimizer's usual update).
    """

    traits = MemoryTraits(feeds_back=True, owns_momentum=True, needs_sparse=True,
                          state_passes=4)  # momentum and residual, each read and written

    def __init__(
        self,
        momentum: float = 0.9,
        nesterov: bool = False,
        momentum_masking: bool = True,
        gradient_clipping: float | None = None,
        world_size: int = 1,
    ) -> None:
        if not (0 <= float(momentum) < 1):
            raise ValueError(f"memory=dgc: momentum={momentum} is outside [0, 1); use e.g. 0.9")
        if gradient_clipping is not None and not float(gradient_clipping) > 0:
            raise ValueError(
                f"memory=dgc: gradient_clipping={gradient_clipping} must be > 0; or null to disable"
            )
        if int(world_size) < 1:
            raise ValueError(f"memory=dgc: world_size={world_size} must be >= 1")
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.momentum_masking = bool(momentum_masking)
        self.world_size = int(world_size)
        self.clip_norm = (
            None if gradient_clipping is None else float(gradient_clipping) / math.sqrt(self.world_size)
        )
        self.momentums: dict[str, Tensor] = {}
        self.velocities: dict[str, Tensor] = {}

    def _clip_factor(self, g: Tensor) -> Tensor:
        """The local clipping factor of `g` (one read of it) as a 0-dim float64 tensor on g's device,
        1.0 where g is not clipped: the reference's factor clip / (norm + 1e-6), computed in double
        precision as the reference's host arithmetic does (the fp32 norm widened, then one double
        add and one double division: the same bits), without the host reading the norm. `g * factor`
        then rounds the factor to g's precision exactly as a multiplication by the host's float."""
        assert self.clip_norm is not None  # called with gradient_clipping only
        norm = torch.linalg.vector_norm(g.float()).double()
        clipped = torch.full_like(norm, self.clip_norm).div_(norm + 1e-6)  # not clip / t: a reciprocal
        return torch.where(norm > self.clip_norm, clipped, torch.ones_like(norm))

    def _clip(self, g: Tensor) -> Tensor:
        return g * self._clip_factor(g)

    def defer(self, g: Tensor, name: str) -> Deferred | None:
        """`compensate` as one pass with the compressor's selection (`codec.deferred.Deferred`); the
        clipping norm is still its own read of g (it must be known before the first element). The
        compiled passes take the clipping factor as a kernel argument: with gradient_clipping the
        host reads it, free on the CPU, one synchronization per tensor on a GPU (`compensate`, the
        unfused path, reads nothing)."""
        u, v = self.momentums.get(name), self.velocities.get(name)
        if u is None or v is None or u.shape != g.shape or not fusable(u, v, g):
            return None
        factor = 1.0 if self.clip_norm is None else float(self._clip_factor(g))  # a kernel argument
        kind = DGC_NESTEROV if self.nesterov else DGC
        return Deferred(u.view(-1), v.view(-1), g, kind, self.momentum, 0.0, factor, out=v)

    def compensate(self, g: Tensor, name: str) -> Tensor:
        if self.clip_norm is not None:
            g = self._clip(g)
        u = self.momentums.get(name)
        if u is None or u.shape != g.shape:
            # Contiguous whatever g's layout, so that flat index masking works.
            u = self.momentums[name] = torch.zeros(g.shape, dtype=g.dtype, device=g.device)
            self.velocities[name] = torch.zeros(g.shape, dtype=g.dtype, device=g.device)
        v = self.velocities[name]
        if self.nesterov:
            u.add_(g).mul_(self.momentum)
            v.add_(u).add_(g)
        else:
            u.mul_(self.momentum).add_(g)
            v.add_(u)
        return v

    def update(self, x: Tensor, name: str, compressor: Compressor, payload: list[Tensor], ctx: Ctx) -> None:
        v = self.velocities[name]
        if any(t.untyped_storage().data_ptr() == v.untyped_storage().data_ptr() for t in payload):
            # A dense payload that is a view of v must stay intact until it is sent: mask a copy.
            v = self.velocities[name] = v.clone()
        # `needs_sparse`: the config check pairs this memory with sparsifiers only, which name
        # what they sent.
        assert is_sparse(compressor), f"memory=dgc needs a sparsifier, not {compressor.name}"
        sent = compressor.sent_indices(payload, ctx).to(v.device)
        v.view(-1).index_fill_(0, sent, 0)
        if self.momentum_masking:
            self.momentums[name].view(-1).index_fill_(0, sent, 0)

    def state_dict(self) -> dict:
        return {
            "momentums": {k: t.clone() for k, t in self.momentums.items()},
            "velocities": {k: t.clone() for k, t in self.velocities.items()},
        }

    def load_state_dict(self, d: dict) -> None:
        self.momentums = {k: t.clone() for k, t in d.get("momentums", {}).items()}
        self.velocities = {k: t.clone() for k, t in d.get("velocities", {}).items()}
