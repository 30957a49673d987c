"""`none`: no error feedback; what the compressor drops is lost."""

from __future__ import annotations

from torch import Tensor

from compbench.codec.base import Compressor, Ctx
from compbench.codec.deferred import Deferred
from compbench.memory.base import MemoryTraits


class NoMemory:
    """Passes the gradient through unchanged."""

    traits = MemoryTraits()  # the optimizer applies momentum as usual (only memory=dgc takes it over)

    def compensate(self, g: Tensor, name: str) -> Tensor:
        return g

    def defer(self, g: Tensor, name: str) -> Deferred | None:
        return None  # nothing to fuse: the gradient is compressed as it is

    def update(self, x: Tensor, name: str, compressor: Compressor, payload: list[Tensor], ctx: Ctx) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, d: dict) -> None:
        pass
