"""Error-feedback memory: what a compressor dropped is kept and added back next step."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

from compbench.compressors.base import Compressor, Ctx


@runtime_checkable
class Memory(Protocol):
    def compensate(self, g: Tensor, name: str) -> Tensor: ...
    def update(self, x: Tensor, name: str, compressor: Compressor, payload: list[Tensor],
               ctx: Ctx) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, d: dict) -> None: ...
