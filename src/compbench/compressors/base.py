"""The compression seam: what every compressor, memory and communicator agrees on.

A compressor turns one flat-or-shaped fp32 tensor into a *payload*: the exact list of tensors that
goes on the wire. Everything needed to decode a peer's payload that is not in the payload must be the
same on every rank (shape, dtype, numel, hyper-parameters): that is the `Ctx`. Anything rank-dependent
(scales, norms, selected indices, counts) travels inside the payload, as 1-element tensors for scalars
(0-dim tensors break Horovod's allgather).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor


@dataclass
class Ctx:
    """Rank-independent facts needed to decode a payload of tensor `name`."""

    name: str
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def make_ctx(x: Tensor, name: str, **meta: Any) -> Ctx:
    return Ctx(name=name, shape=x.shape, dtype=x.dtype, device=x.device, meta=meta)


@runtime_checkable
class Compressor(Protocol):
    name: str
    summable: bool

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]: ...
    def decompress(self, payload: list[Tensor], ctx: Ctx) -> Tensor: ...
    def aggregate(self, decoded: list[Tensor]) -> Tensor: ...


class CompressorBase:
    """Shared defaults. Subclasses set `name`, `summable` and implement compress/decompress.

    `summable` means the payload tensors may be summed element-wise by an allreduce and the sum
    decoded once (decode is linear and the layout is identical on every rank).
    `biased` says whether the compressor needs error feedback to converge well (used for defaults
    and documentation, not enforced).
    """

    name: str = "base"
    summable: bool = False
    # Completes "compressor=X ...; use comm=allgather or comm=ps" when paired with comm=allreduce.
    why_not_summable: str = "sends rank-dependent payloads that cannot be summed element-wise"
    unbiased: bool = False
    # Compressors whose decode of N payloads can be fused (e.g. one scatter-add) override this.
    step: int = 0
    epoch: float = 0.0

    def begin_step(self, step: int, epoch: float) -> None:
        """Called by the trainer before each optimizer step (for seeds, warm-ups, schedules)."""
        self.step = step
        self.epoch = epoch

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        raise NotImplementedError

    def decompress(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        raise NotImplementedError

    def aggregate(self, decoded: list[Tensor]) -> Tensor:
        """Average of the decoded tensors of all ranks."""
        out = decoded[0].clone() if len(decoded) == 1 else torch.stack(decoded).sum(0)
        return out.div_(len(decoded))

    def decompress_all(self, payloads: list[list[Tensor]], ctx: Ctx) -> Tensor:
        """Decode every rank's payload and aggregate; sparse compressors fuse this."""
        return self.aggregate([self.decompress(p, ctx) for p in payloads])

    def wire_bytes(self, numel: int) -> int | None:
        """Exact payload bytes for a tensor of `numel` elements (ALGORITHMS.md), or None when they
        depend on the data (then `max_wire_bytes` bounds them). The contract tests check it."""
        return None

    def max_wire_bytes(self, numel: int) -> int:
        """Upper bound of the payload bytes (the budget a sparsifier must never exceed)."""
        exact = self.wire_bytes(numel)
        assert exact is not None, f"{self.name} must define wire_bytes or max_wire_bytes"
        return exact

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def payload_nbytes(payload: list[Tensor]) -> int:
    """Exact bytes a payload puts on the wire."""
    return sum(t.numel() * t.element_size() for t in payload)


def check_ratio(ratio: float, who: str) -> float:
    # A list, a string or a bool from the command line (`ratio=[1,2]`, `ratio=abc`) is the user's
    # typo, not a number to convert; NaN fails the interval test.
    number = isinstance(ratio, int | float) and not isinstance(ratio, bool)
    if not number or not (0 < float(ratio) <= 1):
        raise ValueError(f"{who}: ratio={ratio} is outside (0, 1]; pass e.g. ratio=1e-3")
    return float(ratio)


def num_selected(numel: int, ratio: float) -> int:
    """k = ceil(n * r), at least 1."""
    return max(1, math.ceil(numel * ratio))
