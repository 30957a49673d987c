"""Communicators: move payloads between ranks and return the averaged dense gradient."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

from compbench.compressors.base import Ctx
from compbench.engines.base import Handle


@runtime_checkable
class Communicator(Protocol):
    requires_summable: bool

    def start(self, payload: list[Tensor], ctx: Ctx) -> Handle: ...
    def wait(self, handle: Handle) -> Tensor: ...
