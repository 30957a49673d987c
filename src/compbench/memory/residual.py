"""`residual`: classic error feedback, x = beta * residual + gamma * g; residual = x - decode(encode(x)).

MergeComp's published residual memory decays the error by 0.9; compbench defaults to beta = gamma = 1
(plain error feedback, as in EF-SGD) and lets a user choose otherwise.
"""

from __future__ import annotations

import torch
from torch import Tensor

from compbench.compressors.base import Compressor, Ctx
from compbench.memory.base import MemoryTraits


class ResidualMemory:
    """Error feedback with configurable decay `beta` and gradient scale `gamma`."""

    traits = MemoryTraits(feeds_back=True)

    def __init__(self, beta: float = 1.0, gamma: float = 1.0) -> None:
        self.beta = float(beta)
        self.gamma = float(gamma)
        self.residuals: dict[str, Tensor] = {}

    def compensate(self, g: Tensor, name: str) -> Tensor:
        r = self.residuals.get(name)
        if r is None:
            return g if self.gamma == 1.0 else g * self.gamma
        # New tensor: g is the user's .grad and must not be modified in place.
        return torch.add(g if self.gamma == 1.0 else g * self.gamma, r, alpha=self.beta)

    def update(self, x: Tensor, name: str, compressor: Compressor, payload: list[Tensor], ctx: Ctx) -> None:
        decoded = compressor.decompress(payload, ctx)
        r = self.residuals.get(name)
        if r is None or r.shape != x.shape:
            self.residuals[name] = x - decoded
        else:
            torch.sub(x, decoded, out=r)

    def state_dict(self) -> dict:
        return {"residuals": {k: v.clone() for k, v in self.residuals.items()}}

    def load_state_dict(self, d: dict) -> None:
        self.residuals = {k: v.clone() for k, v in d.get("residuals", {}).items()}
